// The example models built on skips (models/): pipelined, their gradients equal the plain
// model's for every cut and checkpoint mode.
#include "gradients.h"
#include "test_util.h"

#include "models/resnet.h"
#include "models/unet.h"

#include <gpipe/pipe.h>

namespace gpipe {
namespace models_test {
namespace {

using torch::nn::Sequential;

using testing::expect_close;
using testing::Gradients;
using testing::gradients_of;

// The plain model's gradients: the whole batch at once, or micro-batch by micro-batch (what a
// pipeline computes for layers with batch statistics, such as BatchNorm in training).
Gradients plain(Sequential& model, const torch::Tensor& input, int64_t chunks) {
  return gradients_of(
      [&](const torch::Tensor& x) {
        std::vector<torch::Tensor> outputs;
        for (const auto& part : x.chunk(chunks)) outputs.push_back(model->forward(part));
        return torch::cat(outputs);
      },
      *model, input);
}

Gradients pipelined(Sequential& model, const GPipeOptions& options, const torch::Tensor& input) {
  GPipe pipe(model, options);
  return gradients_of([&](const torch::Tensor& x) { return pipe->forward(x); }, *pipe, input);
}

const std::vector<CheckpointMode> kModes = {CheckpointMode::kNever, CheckpointMode::kAlways,
                                            CheckpointMode::kExceptLast};

models::UNetOptions small_unet() {
  return models::UNetOptions().depth(2).num_convs(1).base_channels(4).dropout(0.0);
}

TEST(UNetTest, Transparency) {
  torch::manual_seed(0);
  Sequential model = models::unet(small_unet());
  ASSERT_EQ(model->size(), 29u);
  model->to(torch::kDouble);
  auto input = torch::rand({4, 3, 8, 8}, torch::kDouble);
  const Gradients expected = plain(model, input, 1);
  // Cuts between every encoder and its decoder, and through both skips.
  for (const auto& balance :
       std::vector<std::vector<int64_t>>{{29}, {10, 19}, {5, 10, 14}, {7, 7, 7, 8}}) {
    for (const auto mode : kModes) {
      SCOPED_TRACE(::testing::Message() << balance.size() << " partitions, " << mode);
      expect_close(pipelined(model, GPipeOptions(balance).chunks(2).checkpoint(mode), input),
                   expected);
    }
  }
}

TEST(UNetTest, CarryingSkipsIsTheSameModel) {
  torch::manual_seed(0);
  Sequential with_skips = models::unet(small_unet());
  torch::manual_seed(0);
  Sequential carrying = models::unet_carrying_skips(small_unet());
  ASSERT_EQ(carrying->size(), with_skips->size());
  auto input = torch::rand({2, 3, 8, 8});
  auto expected = with_skips->forward(input);
  auto output = carrying->forward<std::vector<torch::Tensor>>(std::vector<torch::Tensor>{input});
  ASSERT_EQ(output.size(), 1u);
  EXPECT_TRUE(torch::allclose(output[0], expected));
  EXPECT_EQ(expected.sizes(), (std::vector<int64_t>{2, 1, 8, 8}));
}

TEST(UNetTest, OddSizesArePadded) {
  // 10 x 10 pools to 5 x 5, 2 x 2, then upsamples to 4 x 4: PopCat pads to the skip's 5 x 5.
  Sequential model = models::unet(small_unet());
  EXPECT_EQ(model->forward(torch::rand({1, 3, 10, 10})).sizes(),
            (std::vector<int64_t>{1, 1, 10, 10}));
}

TEST(UNetTest, BadSizes) {
  GPIPE_EXPECT_THROW_WITH(models::unet(models::UNetOptions().depth(0)), c10::ValueError,
                          "U-Net sizes must be positive (depth 0");
}

TEST(ResNetTest, TransparencyWithBatchStatistics) {
  for (const auto& balance : std::vector<std::vector<int64_t>>{{51}, {20, 31}, {10, 15, 26}}) {
    for (const auto mode : kModes) {
      SCOPED_TRACE(::testing::Message() << balance.size() << " partitions, " << mode);
      torch::manual_seed(0);
      Sequential model =
          models::resnet(models::ResNetOptions({1, 1, 1, 1}).base_width(4).num_classes(5));
      ASSERT_EQ(model->size(), 51u);
      model->to(torch::kDouble);
      torch::manual_seed(1);
      auto input = torch::rand({4, 3, 32, 32}, torch::kDouble);
      const Gradients expected = plain(model, input, 2);
      expect_close(pipelined(model, GPipeOptions(balance).chunks(2).checkpoint(mode), input),
                   expected);
    }
  }
}

TEST(ResNetTest, Shapes) {
  Sequential model =
      models::resnet(models::ResNetOptions({1, 2, 1, 1}).base_width(8).num_classes(7));
  EXPECT_EQ(model->size(), 4 + 5 * 11 + 3u);
  model->eval();
  EXPECT_EQ(model->forward(torch::rand({2, 3, 64, 64})).sizes(), (std::vector<int64_t>{2, 7}));
  GPIPE_EXPECT_THROW_WITH(models::resnet(models::ResNetOptions({1, 1, 1})), c10::ValueError,
                          "ResNet needs four positive stage sizes, but got [1, 1, 1]");
}

}  // namespace
}  // namespace models_test
}  // namespace gpipe

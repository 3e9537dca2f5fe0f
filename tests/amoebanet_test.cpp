// AmoebaNet-D (models/amoebanet.h): the same model as torchgpipe's, and pipelined its gradients
// equal the plain model's, its two-tensor states crossing every partition boundary.
#include "gradients.h"
#include "test_util.h"

#include "models/amoebanet.h"

#include <gpipe/pipe.h>

namespace gpipe {
namespace amoebanet_test {
namespace {

using torch::nn::Sequential;

int64_t parameter_count(torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& parameter : module.parameters()) count += parameter.numel();
  return count;
}

using testing::Gradients;

TEST(AmoebaNetTest, LayersAndShapes) {
  Sequential model =
      models::amoebanetd(models::AmoebaNetOptions().num_layers(3).num_filters(8).num_classes(5));
  // stem1, stem2, stem3, cell1_normal1, cell2_reduction, cell3_normal1, cell4_reduction,
  // cell5_normal1, classify.
  ASSERT_EQ(model->size(), 9u);
  EXPECT_EQ(model->named_children()[4].key(), "cell2_reduction");
  model->eval();
  EXPECT_EQ(model->forward(torch::rand({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(models::amoebanetd(models::AmoebaNetOptions().num_layers(18))->size(), 24u);
}

TEST(AmoebaNetTest, ParameterCountMatchesTorchgpipe) {
  // torchgpipe's amoebanetd-memory table: AmoebaNet-D (18, 208) has 81.5M parameters, as the
  // GPipe paper's Table 1 (82M).
  Sequential model = models::amoebanetd(models::AmoebaNetOptions().num_layers(18).num_filters(208));
  EXPECT_NEAR(static_cast<double>(parameter_count(*model)) / 1e6, 81.5, 0.05);
}

TEST(AmoebaNetTest, Transparency) {
  for (const auto& balance :
       std::vector<std::vector<int64_t>>{{9}, {4, 5}, {2, 3, 4}, {1, 1, 1, 1, 1, 1, 1, 1, 1}}) {
    for (const auto mode :
         {CheckpointMode::kNever, CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
      SCOPED_TRACE(::testing::Message() << balance.size() << " partitions, " << mode);
      torch::manual_seed(0);
      Sequential model = models::amoebanetd(
          models::AmoebaNetOptions().num_layers(3).num_filters(8).num_classes(5));
      model->to(torch::kDouble);
      auto input = torch::rand({4, 3, 32, 32}, torch::kDouble);
      // BatchNorm normalizes each micro-batch by itself: the plain model runs them one by one.
      const Gradients expected = testing::gradients_of(
          [&](const torch::Tensor& x) {
            return torch::cat({model->forward(x.slice(0, 0, 2)), model->forward(x.slice(0, 2))});
          },
          *model, input);
      GPipe pipe(model, GPipeOptions(balance).chunks(2).checkpoint(mode));
      const Gradients actual = testing::gradients_of(
          [&](const torch::Tensor& x) { return pipe->forward(x); }, *pipe, input);
      testing::expect_close(actual, expected);
    }
  }
}

TEST(AmoebaNetTest, BadSizes) {
  GPIPE_EXPECT_THROW_WITH(models::amoebanetd(models::AmoebaNetOptions().num_layers(4)),
                          c10::ValueError, "positive multiple of 3 normal cells (num_layers 4)");
  GPIPE_EXPECT_THROW_WITH(models::amoebanetd(models::AmoebaNetOptions().num_filters(4)),
                          c10::ValueError, "num_filters >= 8");
}

}  // namespace
}  // namespace amoebanet_test
}  // namespace gpipe

// Tests of Stage: backward_input() then backward_weight() give the gradients of one fused
// backward(), on the first, a middle and the last stage, with shared weights and list batches.
#include "test_util.h"

#include "gpipe/schedule/stage.h"
#include "models/char_gpt.h"

#include <functional>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {
namespace schedule_stage_test {
namespace {

bool close(const at::Tensor& actual, const at::Tensor& expected) {
  return actual.defined() && expected.defined() &&
         torch::allclose(actual, expected, /*rtol=*/1e-6, /*atol=*/1e-12);
}

// Linear, Tanh, then `shared` (the same Linear twice when true) and Linear, in double precision.
torch::nn::Sequential make_module(bool shared) {
  torch::manual_seed(3);
  torch::nn::Linear square(6, 6);
  torch::nn::Sequential module(torch::nn::Linear(5, 6), torch::nn::Tanh(), square,
                               torch::nn::Tanh());
  module->push_back(shared ? square : torch::nn::Linear(6, 6));
  module->push_back(torch::nn::Linear(6, 3));
  module->to(torch::kDouble);
  return module;
}

at::Tensor mse(const Batch& output, const Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

// Runs micro-batches 0 and 1 through stage `index` of 3 twice, fused and split, and compares the
// input gradients and the parameters' accumulated gradients.
void expect_split_equals_fused(const std::function<torch::nn::Sequential()>& make,
                               std::vector<at::Tensor> inputs, std::vector<at::Tensor> grads,
                               int64_t index) {
  const bool last = index == 2;
  std::vector<Batch> grad_inputs[2];
  std::vector<at::Tensor> parameter_grads[2];
  for (const bool split : {false, true}) {
    auto module = make();
    Stage stage(index, 3, module, c10::Device(c10::kCPU), CheckpointMode::kNever);
    for (int64_t i = 0; i < 2; ++i) {
      if (last) {
        stage.forward_loss(i, Batch(inputs[i]), Batch(grads[i]), mse, 0.5);
      } else {
        stage.forward(i, Batch(inputs[i]));
      }
    }
    for (int64_t i = 0; i < 2; ++i) {
      const Batch grad_output = last ? Batch(std::vector<at::Tensor>{}) : Batch(grads[i]);
      grad_inputs[split].push_back(split ? stage.backward_input(i, grad_output)
                                         : stage.backward(i, grad_output));
      if (split) {
        // Nothing reaches the parameters before backward_weight().
        for (const auto& p : module->parameters()) {
          EXPECT_FALSE(p.grad().defined()) << "stage " << index;
        }
      }
    }
    if (split) {
      EXPECT_EQ(stage.peak_live_microbatches(), 2);
      for (int64_t i = 0; i < 2; ++i) stage.backward_weight(i);
    }
    for (const auto& p : module->parameters()) parameter_grads[split].push_back(p.grad());
  }
  for (int64_t i = 0; i < 2; ++i) {
    ASSERT_EQ(grad_inputs[0][i].size(), grad_inputs[1][i].size());
    for (size_t k = 0; k < grad_inputs[0][i].size(); ++k) {
      if (index == 0) continue;
      EXPECT_TRUE(close(grad_inputs[1][i][k], grad_inputs[0][i][k]))
          << "stage " << index << ", micro-batch " << i;
    }
  }
  ASSERT_EQ(parameter_grads[0].size(), parameter_grads[1].size());
  for (size_t k = 0; k < parameter_grads[0].size(); ++k) {
    EXPECT_TRUE(close(parameter_grads[1][k], parameter_grads[0][k]))
        << "stage " << index << ", parameter " << k;
  }
}

void expect_split_equals_fused(int64_t index, bool shared) {
  torch::manual_seed(11);
  expect_split_equals_fused(
      [shared] { return make_module(shared); },
      {torch::randn({4, 5}, torch::kDouble), torch::randn({3, 5}, torch::kDouble)},
      {torch::randn({4, 3}, torch::kDouble), torch::randn({3, 3}, torch::kDouble)}, index);
}

TEST(StageTest, SplitBackwardEqualsFusedBackward) {
  for (const int64_t index : {0, 1, 2}) expect_split_equals_fused(index, /*shared=*/false);
}

TEST(StageTest, SplitBackwardOfTransformerLayers) {
  // The char GPT's blocks and head: LayerNorm, attention (matmul, masked_fill, softmax), GELU,
  // and Linear on 3-d inputs.
  const auto options =
      models::CharGPTOptions().num_layers(2).embedding_dim(8).num_heads(2).block_size(5);
  const auto make = [&] {
    torch::manual_seed(5);
    auto gpt = models::char_gpt(options);
    torch::nn::Sequential stage;
    for (auto layer = gpt->begin() + 1; layer != gpt->end(); ++layer) stage->push_back(*layer);
    stage->to(torch::kDouble);
    return stage;
  };
  torch::manual_seed(12);
  for (const int64_t index : {1, 2}) {
    const int64_t out = 256;  // the head's logits
    expect_split_equals_fused(
        make, {torch::randn({2, 5, 8}, torch::kDouble), torch::randn({3, 5, 8}, torch::kDouble)},
        {torch::randn({2, 5, out}, torch::kDouble), torch::randn({3, 5, out}, torch::kDouble)},
        index);
  }
}

TEST(StageTest, SplitBackwardWithSharedWeights) {
  for (const int64_t index : {1, 2}) expect_split_equals_fused(index, /*shared=*/true);
}

TEST(StageTest, SplitBackwardChecksOrder) {
  Stage stage(1, 3, make_module(false), c10::Device(c10::kCPU), CheckpointMode::kNever);
  const Batch grad(torch::ones({2, 3}, torch::kDouble));
  stage.forward(0, Batch(torch::randn({2, 5}, torch::kDouble)));
  GPIPE_EXPECT_THROW_WITH(stage.backward_weight(0), c10::ValueError,
                          "stage 1 has not run backward_input of micro-batch 0");
  stage.backward_input(0, grad);
  GPIPE_EXPECT_THROW_WITH(stage.backward_input(0, grad), c10::ValueError,
                          "stage 1 already ran backward_input of micro-batch 0");
  GPIPE_EXPECT_THROW_WITH(stage.backward(0, grad), c10::ValueError,
                          "stage 1 already ran backward_input of micro-batch 0");
  stage.backward_weight(0);
  GPIPE_EXPECT_THROW_WITH(stage.backward_weight(0), c10::ValueError,
                          "stage 1 has no forward of micro-batch 0 to backward_weight");
}

// A stage without parameters: backward_input() does it all, backward_weight() has nothing to do.
TEST(StageTest, SplitBackwardWithoutParameters) {
  Stage stage(1, 3, torch::nn::Sequential(torch::nn::Tanh()), c10::Device(c10::kCPU),
              CheckpointMode::kNever);
  const at::Tensor x = torch::randn({2, 5}, torch::kDouble);
  const at::Tensor g = torch::randn({2, 5}, torch::kDouble);
  stage.forward(0, Batch(x));
  const Batch grad_input = stage.backward_input(0, Batch(g));
  stage.backward_weight(0);
  EXPECT_TRUE(close(grad_input.tensor(), g * (1 - torch::tanh(x).pow(2))));
}

// x.mm(w) that records, at each backward, which gradients autograd asks it for.
struct RecordingMatMul : torch::autograd::Function<RecordingMatMul> {
  static std::vector<std::pair<bool, bool>>& asked() {
    static std::vector<std::pair<bool, bool>> calls;
    return calls;
  }
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return x.mm(w);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool input = ctx->needs_input_grad(0);
    const bool weight = ctx->needs_input_grad(1);
    asked().emplace_back(input, weight);
    return {input ? grads[0].mm(saved[1].t()) : at::Tensor(),
            weight ? saved[0].t().mm(grads[0]) : at::Tensor()};
  }
};

struct RecordingLinearImpl : torch::nn::Module {
  RecordingLinearImpl() : weight(register_parameter("weight", torch::randn({4, 4}))) {}
  at::Tensor forward(const at::Tensor& x) { return RecordingMatMul::apply(x, weight); }
  at::Tensor weight;
};
TORCH_MODULE(RecordingLinear);

// The point of the split: backward_input() computes no weight gradient and backward_weight() no
// input gradient, each only its half of the node where the two paths part.
TEST(StageTest, SplitBackwardComputesEachGradientOnce) {
  RecordingLinear linear;
  Stage stage(1, 3, torch::nn::Sequential(linear), c10::Device(c10::kCPU), CheckpointMode::kNever);
  const at::Tensor x = torch::randn({2, 4});
  const at::Tensor g = torch::randn({2, 4});
  stage.forward(0, Batch(x));
  RecordingMatMul::asked().clear();
  const Batch grad_input = stage.backward_input(0, Batch(g));
  EXPECT_EQ(RecordingMatMul::asked(), (std::vector<std::pair<bool, bool>>{{true, false}}));
  EXPECT_FALSE(linear->weight.grad().defined());
  stage.backward_weight(0);
  EXPECT_EQ(RecordingMatMul::asked(),
            (std::vector<std::pair<bool, bool>>{{true, false}, {false, true}}));
  EXPECT_TRUE(close(grad_input.tensor(), g.mm(linear->weight.detach().t())));
  EXPECT_TRUE(close(linear->weight.grad(), x.t().mm(g)));
}

}  // namespace
}  // namespace schedule_stage_test
}  // namespace schedule
}  // namespace gpipe

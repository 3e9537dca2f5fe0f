// GPipe is transparent: outputs, parameter gradients and input gradients equal the plain
// Sequential's, for every balance, chunk count and checkpoint mode. Ports test_transparency.py
// and goes much further.
#include "test_util.h"

#include <gpipe/gpipe.h>
#include "pipeline/pipeline.h"

#include <functional>

namespace gpipe {
namespace transparency_test {
namespace {

using torch::nn::Sequential;

// Every way to cut `layers` layers into 1..max_parts consecutive non-empty partitions.
std::vector<std::vector<int64_t>> every_balance(int64_t layers, int64_t max_parts) {
  std::vector<std::vector<int64_t>> balances;
  std::vector<int64_t> current;
  std::function<void(int64_t)> extend = [&](int64_t left) {
    if (left == 0) {
      balances.push_back(current);
      return;
    }
    if (static_cast<int64_t>(current.size()) == max_parts) return;
    for (int64_t take = 1; take <= left; ++take) {
      current.push_back(take);
      extend(left - take);
      current.pop_back();
    }
  };
  extend(layers);
  return balances;
}

Sequential mlp() {
  return Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 16),
                    torch::nn::Tanh(), torch::nn::Linear(16, 8), torch::nn::ReLU(),
                    torch::nn::Linear(8, 4));
}

Sequential convnet() {
  return Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)),
                    torch::nn::ReLU(),
                    torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1)),
                    torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(4 * 6 * 6, 5));
}

struct Result {
  torch::Tensor output;
  torch::Tensor input_grad;
  std::vector<torch::Tensor> parameter_grads;
};

// Runs forward and a weighted-sum backward, then collects and clears the gradients.
Result run(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
           const std::vector<torch::Tensor>& parameters, const torch::Tensor& input,
           const torch::Tensor& weight) {
  auto x = input.clone().requires_grad_(true);
  Result result;
  result.output = forward(x);
  (result.output * weight).sum().backward();
  result.input_grad = x.grad();
  for (const auto& p : parameters) {
    result.parameter_grads.push_back(p.grad().clone());
    p.mutable_grad().reset();
  }
  return result;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& expected, bool bitwise,
                  const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  if (bitwise) {
    EXPECT_TRUE(testing::bitwise_equal(got, expected)) << what;
  } else {
    EXPECT_TRUE(torch::allclose(got, expected, /*rtol=*/1e-6, /*atol=*/1e-9))
        << what << ": max difference " << (got - expected).abs().max().item<double>();
  }
}

// Every partition on `device` (on a GPU: several partitions on one device, each with its own
// streams, so that Copy/Wait and record_stream run).
void expect_transparent(const std::function<Sequential()>& make, const torch::Tensor& input,
                        int64_t layers, torch::Dtype dtype,
                        const std::vector<int64_t>& chunk_counts, bool bitwise,
                        const torch::Device& device = torch::kCPU) {
  torch::manual_seed(0);
  Sequential sequential = make();
  sequential->to(device, dtype);
  const auto parameters = sequential->parameters();
  const auto x = input.to(device, dtype);
  torch::Tensor weight = torch::randn_like(sequential->forward(x));
  const Result expected =
      run([&](const torch::Tensor& in) { return sequential->forward(in); }, parameters, x, weight);

  for (const auto& balance : every_balance(layers, 4)) {
    for (const int64_t chunks : chunk_counts) {
      for (const auto mode :
           {CheckpointMode::kAlways, CheckpointMode::kExceptLast, CheckpointMode::kNever}) {
        GPipe model(sequential, GPipeOptions(balance)
                                    .devices(std::vector<torch::Device>(balance.size(), device))
                                    .chunks(chunks)
                                    .checkpoint(mode));
        const Result got =
            run([&](const torch::Tensor& in) { return model->forward(in); }, parameters, x, weight);
        std::ostringstream what;
        what << "balance " << c10::IntArrayRef(balance) << " chunks " << chunks << " " << mode;
        expect_close(got.output, expected.output, bitwise, what.str() + " output");
        expect_close(got.input_grad, expected.input_grad, bitwise, what.str() + " input grad");
        for (size_t k = 0; k < parameters.size(); ++k) {
          expect_close(got.parameter_grads[k], expected.parameter_grads[k], bitwise,
                       what.str() + " parameter " + std::to_string(k));
        }
        if (::testing::Test::HasFailure()) return;  // one report is enough
      }
    }
  }
}

TEST(TransparencyTest, SimpleLinears) {
  torch::manual_seed(0);
  Sequential sequential(torch::nn::Linear(1, 2), torch::nn::Linear(2, 4), torch::nn::Linear(4, 2),
                        torch::nn::Linear(2, 1));
  auto input = torch::rand({8, 1});
  auto sum_grad = [&] {
    auto total = torch::zeros({});
    for (auto& p : sequential->parameters()) {
      total += p.grad().sum();
      p.mutable_grad().reset();
    }
    return total;
  };
  sequential->forward(input).mean().backward();
  auto without_gpipe = sum_grad();
  GPipe model(sequential, GPipeOptions({2, 2}).chunks(4));
  model->forward(input).mean().backward();
  EXPECT_TRUE(torch::allclose(sum_grad(), without_gpipe));
}

// One micro-batch computes exactly what the Sequential computes, bit for bit.
TEST(TransparencyTest, MlpBitwiseWithOneChunk) {
  expect_transparent(mlp, torch::randn({16, 8}), 7, torch::kFloat, {1}, /*bitwise=*/true);
}

TEST(TransparencyTest, ConvNetBitwiseWithOneChunk) {
  expect_transparent(convnet, torch::randn({6, 3, 6, 6}), 6, torch::kFloat, {1}, true);
}

// More micro-batches only reorder floating-point sums.
TEST(TransparencyTest, MlpEveryBalanceChunksAndMode) {
  expect_transparent(mlp, torch::randn({16, 8}), 7, torch::kDouble, {1, 2, 4, 7}, false);
}

TEST(TransparencyTest, ConvNetEveryBalanceChunksAndMode) {
  expect_transparent(convnet, torch::randn({14, 3, 6, 6}), 6, torch::kDouble, {1, 2, 4, 7}, false);
}

TEST(TransparencyTest, MlpBitwiseWithOneChunkOnOneGpu_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  expect_transparent(mlp, torch::randn({16, 8}), 7, torch::kFloat, {1}, true, torch::kCUDA);
}

TEST(TransparencyTest, MlpEveryBalanceChunksAndModeOnOneGpu_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  expect_transparent(mlp, torch::randn({16, 8}), 7, torch::kDouble, {1, 2, 4, 7}, false,
                     torch::kCUDA);
}

TEST(TransparencyTest, ConvNetEveryBalanceChunksAndModeOnOneGpu_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  expect_transparent(convnet, torch::randn({14, 3, 6, 6}), 6, torch::kDouble, {1, 2, 4, 7}, false,
                     torch::kCUDA);
}

// With dropout, the reference is the same layers run micro-batch by micro-batch in GPipe's clock
// order, so the random streams line up; checkpointed micro-batches must then recompute with the
// very same masks, or their gradients would differ.
// On a GPU the masks come from the CUDA generator, whose state checkpointing saves and restores.
void expect_dropout_masks_survive_recomputation(const torch::Device& device) {
  torch::manual_seed(0);
  Sequential sequential(torch::nn::Linear(8, 16), torch::nn::Dropout(0.5), torch::nn::ReLU(),
                        torch::nn::Linear(16, 16), torch::nn::Dropout(0.3),
                        torch::nn::Linear(16, 4));
  sequential->to(device, torch::kDouble);
  const auto parameters = sequential->parameters();
  const auto input = torch::randn({12, 8}, torch::kDouble).to(device);
  const auto weight = torch::randn({12, 4}, torch::kDouble).to(device);

  for (const auto& balance : every_balance(6, 3)) {
    for (const int64_t chunks : {1, 3, 4}) {
      // The reference: the partitions as plain Sequentials, in clock order, one thread.
      std::vector<Sequential> parts;
      size_t layer = 0;
      for (const int64_t size : balance) {
        Sequential part;
        for (int64_t k = 0; k < size; ++k) part->push_back(*(sequential->begin() + layer++));
        parts.push_back(part);
      }
      auto clock_order = [&](const torch::Tensor& x) {
        auto batches = x.chunk(chunks);
        for (const auto& clock : clock_cycles(batches.size(), parts.size())) {
          for (const auto& step : clock) {
            batches[step.microbatch] = parts[step.partition]->forward(batches[step.microbatch]);
          }
        }
        return torch::cat(batches);
      };
      torch::manual_seed(42);
      const Result expected = run(clock_order, parameters, input, weight);

      for (const auto mode :
           {CheckpointMode::kAlways, CheckpointMode::kExceptLast, CheckpointMode::kNever}) {
        GPipe model(sequential, GPipeOptions(balance)
                                    .devices(std::vector<torch::Device>(balance.size(), device))
                                    .chunks(chunks)
                                    .checkpoint(mode));
        torch::manual_seed(42);
        const Result got = run([&](const torch::Tensor& x) { return model->forward(x); },
                               parameters, input, weight);
        std::ostringstream what;
        what << "balance " << c10::IntArrayRef(balance) << " chunks " << chunks << " " << mode;
        expect_close(got.output, expected.output, false, what.str() + " output");
        expect_close(got.input_grad, expected.input_grad, false, what.str() + " input grad");
        for (size_t k = 0; k < parameters.size(); ++k) {
          expect_close(got.parameter_grads[k], expected.parameter_grads[k], false,
                       what.str() + " parameter " + std::to_string(k));
        }
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(TransparencyTest, DropoutMasksSurviveRecomputation) {
  expect_dropout_masks_survive_recomputation(torch::kCPU);
}

TEST(TransparencyTest, DropoutMasksSurviveRecomputationOnOneGpu_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  expect_dropout_masks_survive_recomputation(torch::Device(torch::kCUDA, 0));
}

// Inputs that need no grad work too, and non-floating outputs come back detached.
TEST(TransparencyTest, InputsNotRequiringGradAndIntegerOutputs) {
  struct SplitImpl : torch::nn::Module {
    std::vector<torch::Tensor> forward(torch::Tensor x) { return {x * 2, x.argmax(1)}; }
  };
  struct MergeImpl : torch::nn::Module {
    torch::Tensor forward(std::vector<torch::Tensor> xs) {
      return xs[0] + xs[1].unsqueeze(1).to(xs[0].scalar_type());
    }
  };
  torch::nn::Linear linear(3, 3);
  Sequential sequential(linear, std::make_shared<SplitImpl>(), std::make_shared<MergeImpl>());
  auto input = torch::randn({6, 3});
  auto expected = sequential->forward(input);
  expected.sum().backward();
  auto expected_grad = linear->weight.grad().clone();
  linear->weight.mutable_grad().reset();
  for (const auto mode : {CheckpointMode::kAlways, CheckpointMode::kNever}) {
    GPipe model(sequential, GPipeOptions({2, 1}).chunks(3).checkpoint(mode));
    auto output = model->forward(input);
    expect_close(output, expected, false, "output");
    output.sum().backward();
    expect_close(linear->weight.grad(), expected_grad, false, "weight grad");
    linear->weight.mutable_grad().reset();
  }
  GPipe split(Sequential(std::make_shared<SplitImpl>()), GPipeOptions({1}).chunks(2));
  auto outputs =
      split->forward<std::vector<torch::Tensor>>(torch::randn({4, 3}, torch::requires_grad()));
  EXPECT_TRUE(outputs[0].requires_grad());
  EXPECT_FALSE(outputs[1].requires_grad());
  EXPECT_EQ(outputs[1].scalar_type(), torch::kLong);
}

}  // namespace
}  // namespace transparency_test
}  // namespace gpipe

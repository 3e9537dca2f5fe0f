// Tests of mixed precision in every engine: the Autocast scope behaves as torch.autocast; under
// it, every layer of GPipe's and the schedule engines' stages sees the dtype and the autocast
// settings the plain model's layer sees, recomputations included with backward outside the
// scope; and the gradients are the plain model's under the same autocast. (Ranks:
// distributed_recipes_test.cpp.)
#include "plain_reference.h"
#include "test_util.h"

#include "detail/autocast_state.h"
#include "gpipe/amp/autocast.h"
#include "gpipe/checkpoint.h"
#include "gpipe/pipe.h"
#include "gpipe/schedule/runtime.h"

#include <torch/torch.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace gpipe {
namespace autocast_test {
namespace {

// The plain model and a pipeline see the same micro-batches through the same kernels, so only
// the order in which float32 gradients of micro-batches are added may differ: a few float32
// roundings of the largest gradient (2^-24 each), far below bfloat16's own (2^-8).
constexpr double kTolerance = 1e-5;

torch::nn::Sequential recording_model(std::vector<int64_t>& balance) {
  return testing::distributed_model(balance, -1, "", false, false, /*recording=*/true);
}

std::pair<torch::Tensor, torch::Tensor> float_batch() {
  auto [input, target] = testing::distributed_batch();
  return {input.to(torch::kFloat), target.to(torch::kFloat)};
}

TEST(AutocastTest, ScopeSetsAndRestoresAsTorchAutocast) {
  EXPECT_FALSE(detail::autocast_enabled(torch::kCPU));
  const auto outer_dtype = detail::autocast_dtype(torch::kCPU);
  const auto x = torch::randn({2, 3});
  const auto w = torch::randn({3, 3});
  {
    amp::Autocast autocast(torch::kCPU);
    EXPECT_TRUE(detail::autocast_enabled(torch::kCPU));
    EXPECT_EQ(torch::mm(x, w).scalar_type(), torch::kBFloat16);
    {
      amp::Autocast off(torch::kCPU, c10::nullopt, /*enabled=*/false);
      EXPECT_FALSE(detail::autocast_enabled(torch::kCPU));
      EXPECT_EQ(torch::mm(x, w).scalar_type(), torch::kFloat);
    }
    EXPECT_TRUE(detail::autocast_enabled(torch::kCPU));
  }
  EXPECT_FALSE(detail::autocast_enabled(torch::kCPU));
  EXPECT_EQ(detail::autocast_dtype(torch::kCPU), outer_dtype);
  EXPECT_EQ(torch::mm(x, w).scalar_type(), torch::kFloat);
  GPIPE_EXPECT_THROW_WITH(amp::Autocast(torch::kMeta), c10::ValueError, "runs on cpu or cuda");
  GPIPE_EXPECT_THROW_WITH(amp::Autocast(torch::kCPU, torch::kDouble), c10::ValueError,
                          "BFloat16 or Half, not Double");
  EXPECT_FALSE(detail::autocast_enabled(torch::kCPU));
}

// A C++ loop that only turned autocast on and off would keep a weight's cast past the
// optimizer's step; the scope drops it, as Python's does.
TEST(AutocastTest, ScopeDropsCachedCastsWhenItEnds) {
  torch::nn::Linear linear(4, 4);
  const auto x = torch::randn({2, 4});
  torch::Tensor before, after;
  {
    amp::Autocast autocast(torch::kCPU);
    before = linear(x);
  }
  {
    torch::NoGradGuard no_grad;
    linear->weight.mul_(2);
  }
  {
    amp::Autocast autocast(torch::kCPU);
    after = linear(x);
  }
  const auto expected =
      torch::nn::functional::linear(x.to(torch::kBFloat16), linear->weight.to(torch::kBFloat16),
                                    linear->bias.to(torch::kBFloat16));
  EXPECT_FALSE(torch::equal(before, after));
  EXPECT_TRUE(testing::bitwise_equal(after, expected));
}

// gpipe::checkpoint under autocast with backward outside it: the recomputation runs in
// bfloat16 as the forward did, and the forward under no-grad caches no cast that would cut the
// weight's gradient for a later use in the same scope (LibTorch 1.13 caches the cast of a leaf
// weight under no-grad; the cache is on in the checkpointed scope, and the reference casts each
// use on its own, as the checkpoint does).
TEST(AutocastTest, CheckpointRecomputesUnderItsForwardsAutocast) {
  torch::manual_seed(0);
  const auto weight = torch::randn({4, 4}, torch::requires_grad());
  const auto x = torch::randn({3, 4});
  const auto gradient_of_weight = [&](bool checkpointed) {
    weight.mutable_grad() = torch::Tensor();
    torch::Tensor loss;
    std::vector<c10::ScalarType> seen;
    {
      amp::Autocast autocast(torch::kCPU, c10::nullopt, true, /*cache_enabled=*/checkpointed);
      const BatchFunction function = [&](const Batch& in) {
        seen.push_back(detail::autocast_enabled(torch::kCPU) ? torch::kBFloat16 : torch::kFloat);
        return Batch(torch::mm(in.tensor(), weight));
      };
      const auto a = checkpointed ? checkpoint(function, Batch(x)).tensor() : torch::mm(x, weight);
      const auto b = torch::mm(x, weight);
      loss = (a.to(torch::kFloat) * 2).sum() + b.to(torch::kFloat).sum();
    }
    loss.backward();
    if (checkpointed) {
      EXPECT_EQ(seen, (std::vector<c10::ScalarType>{torch::kBFloat16, torch::kBFloat16}));
    }
    return weight.grad().clone();
  };
  const auto expected = gradient_of_weight(false);
  const auto actual = gradient_of_weight(true);
  EXPECT_TRUE(testing::bitwise_equal(actual, expected)) << actual << expected;
}

// GPipe with checkpointing, forward and loss under autocast, backward outside (PyTorch's AMP
// recipe): every layer sees bfloat16 under autocast, in the forward and in the recomputation.
TEST(AutocastTest, GPipeRecomputesUnderTheForwardsAutocast) {
  const auto [input, target] = float_batch();
  std::vector<int64_t> balance = testing::distributed_balance(2);
  auto plain_model = recording_model(balance);
  testing::take_dtype_log();
  const testing::PlainStep plain = testing::plain_step(plain_model, input, target, 4, true);
  const auto expected_seen = testing::take_dtype_log();
  for (const auto mode : {CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
    SCOPED_TRACE(c10::str("checkpoint ", mode));
    auto model = recording_model(balance);
    GPipe pipe(model, GPipeOptions(balance).chunks(4).checkpoint(mode));
    torch::Tensor loss;
    {
      amp::Autocast autocast(torch::kCPU);
      loss = torch::mse_loss(pipe->forward(input), target);
    }
    loss.backward();
    bool recomputed = false;
    EXPECT_EQ(testing::take_dtype_log(&recomputed), expected_seen);
    EXPECT_TRUE(recomputed);
    EXPECT_LE(testing::relative_difference(loss, plain.loss), kTolerance);
    const auto parameters = model->parameters();
    for (size_t k = 0; k < parameters.size(); ++k) {
      EXPECT_LE(testing::relative_difference(parameters[k].grad(), plain.grads[k]), kTolerance)
          << "parameter " << k;
    }
  }
}

// Each schedule's workers run under the caller's autocast: every layer sees what the plain
// model's sees, and the gradients are the plain model's on the same micro-batches.
TEST(AutocastTest, EveryScheduleRunsItsStagesUnderTheCallersAutocast) {
  using schedule::ScheduleKind;
  const auto [input, target] = float_batch();
  struct Case {
    ScheduleKind kind;
    int64_t stages_per_worker;
    CheckpointMode checkpoint;
  };
  const std::vector<Case> cases{
      {ScheduleKind::kGPipe, 1, CheckpointMode::kAlways},
      {ScheduleKind::kOneFOneB, 1, CheckpointMode::kExceptLast},
      {ScheduleKind::kOneFOneB, 1, CheckpointMode::kNever},
      {ScheduleKind::kInterleavedOneFOneB, 2, CheckpointMode::kAlways},
      {ScheduleKind::kLoopedBFS, 2, CheckpointMode::kNever},
      {ScheduleKind::kZeroBubble, 1, CheckpointMode::kNever},
      {ScheduleKind::kInterleavedZeroBubble, 2, CheckpointMode::kNever},
      {ScheduleKind::kZeroBubbleV, 2, CheckpointMode::kNever},
      {ScheduleKind::kDualPipeV, 2, CheckpointMode::kNever},
      {ScheduleKind::kVMin, 2, CheckpointMode::kNever},
      {ScheduleKind::kVHalf, 2, CheckpointMode::kNever},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c10::str(c.kind, ", checkpoint ", c.checkpoint));
    std::vector<int64_t> balance = testing::distributed_balance(2 * c.stages_per_worker);
    auto plain_model = recording_model(balance);
    testing::take_dtype_log();
    const auto plain = testing::plain_step(plain_model, input, target, 4, true);
    const auto expected_seen = testing::take_dtype_log();

    auto model = recording_model(balance);
    schedule::PipelineSchedule pipe(
        model, balance,
        [](const Batch& y, const Batch& t) { return torch::mse_loss(y.tensor(), t.tensor()); },
        schedule::PipelineScheduleOptions(4)
            .schedule(c.kind)
            .stages_per_worker(c.stages_per_worker)
            .checkpoint(c.checkpoint));
    torch::Tensor loss;
    {
      amp::Autocast autocast(torch::kCPU);
      loss = pipe.step(input, target);
    }
    bool recomputed = false;
    EXPECT_EQ(testing::take_dtype_log(&recomputed), expected_seen);
    EXPECT_EQ(recomputed, c.checkpoint != CheckpointMode::kNever);
    EXPECT_LE(testing::relative_difference(loss, plain.loss), kTolerance);
    const auto parameters = model->parameters();
    for (size_t k = 0; k < parameters.size(); ++k) {
      EXPECT_LE(testing::relative_difference(parameters[k].grad(), plain.grads[k]), kTolerance)
          << "parameter " << k;
    }
  }
}

// On a GPU in float16: GPipe's device threads and the schedule engine's workers run under the
// caller's autocast, recomputations too; gradients as on the CPU.
TEST(AutocastTest, EnginesOnCudaInFloat16_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  const c10::Device cuda(c10::kCUDA, 0);
  auto [input, target] = float_batch();
  input = input.to(cuda);
  target = target.to(cuda);
  std::vector<int64_t> balance = testing::distributed_balance(2);
  auto plain_model = recording_model(balance);
  plain_model->to(cuda);
  testing::take_dtype_log();
  const auto plain = testing::plain_step(plain_model, input, target, 4, true, torch::kHalf);
  const auto expected_seen = testing::take_dtype_log();

  auto gpipe_model = recording_model(balance);
  GPipe gpipe(
      gpipe_model,
      GPipeOptions(balance).devices({cuda, cuda}).chunks(4).checkpoint(CheckpointMode::kAlways));
  torch::Tensor loss;
  {
    amp::Autocast autocast(torch::kCUDA, torch::kHalf);
    loss = torch::mse_loss(gpipe->forward(input), target);
  }
  loss.backward();
  bool recomputed = false;
  EXPECT_EQ(testing::take_dtype_log(&recomputed), expected_seen);
  EXPECT_TRUE(recomputed);
  auto parameters = gpipe_model->parameters();
  for (size_t k = 0; k < parameters.size(); ++k) {
    EXPECT_LE(testing::relative_difference(parameters[k].grad(), plain.grads[k]), kTolerance)
        << "GPipe, parameter " << k;
  }

  auto model = recording_model(balance);
  schedule::PipelineSchedule pipe(
      model, balance,
      [](const Batch& y, const Batch& t) { return torch::mse_loss(y.tensor(), t.tensor()); },
      schedule::PipelineScheduleOptions(4)
          .devices({cuda, cuda})
          .checkpoint(CheckpointMode::kExceptLast));
  {
    amp::Autocast autocast(torch::kCUDA, torch::kHalf);
    pipe.step(input, target);
  }
  EXPECT_EQ(testing::take_dtype_log(), expected_seen);
  parameters = model->parameters();
  for (size_t k = 0; k < parameters.size(); ++k) {
    EXPECT_LE(testing::relative_difference(parameters[k].grad(), plain.grads[k]), kTolerance)
        << "PipelineSchedule, parameter " << k;
  }
}

// Records whether autocast is on where its backward runs.
struct BackwardProbe : torch::autograd::Function<BackwardProbe> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    std::lock_guard<std::mutex> lock(testing::dtype_log_mutex());
    testing::dtype_log()[-1].insert(detail::autocast_enabled(torch::kCPU) ? "under autocast"
                                                                          : "outside autocast");
    return grad;
  }
};

// Backwards run outside autocast, as the recipe's loss.backward() does, though step() runs
// inside the scope.
TEST(AutocastTest, BackwardsRunOutsideAutocast) {
  std::vector<int64_t> balance{2, 2};
  for (const auto kind : {schedule::ScheduleKind::kOneFOneB, schedule::ScheduleKind::kZeroBubble}) {
    SCOPED_TRACE(c10::str(kind));
    torch::nn::Sequential model(
        torch::nn::Linear(4, 4),
        torch::nn::Functional([](torch::Tensor x) { return BackwardProbe::apply(x); }),
        torch::nn::Linear(4, 4),
        torch::nn::Functional([](torch::Tensor x) { return BackwardProbe::apply(x); }));
    schedule::PipelineSchedule pipe(
        model, balance,
        [](const Batch& y, const Batch& t) {
          return torch::mse_loss(y.tensor().to(torch::kFloat), t.tensor());
        },
        schedule::PipelineScheduleOptions(2).schedule(kind));
    testing::take_dtype_log();
    {
      amp::Autocast autocast(torch::kCPU);
      pipe.step(torch::randn({4, 4}), torch::randn({4, 4}));
    }
    const auto seen = testing::take_dtype_log();
    EXPECT_EQ(seen.at(-1), std::set<std::string>{"outside autocast"});
  }
}

}  // namespace
}  // namespace autocast_test
}  // namespace gpipe

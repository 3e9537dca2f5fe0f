// Tests of evaluation on the schedule engines' threads: evaluate() gives the plain model's
// output, bitwise in float64 on the same micro-batches, and step()'s loss; it keeps no
// activations and touches no gradient, before the first step and between steps. (Ranks:
// distributed_recipes_test.cpp.)
#include "distributed_model.h"
#include "plain_reference.h"
#include "test_util.h"

#include "gpipe/schedule/runtime.h"

#include <torch/torch.h>

#include <vector>

namespace gpipe {
namespace schedule {
namespace evaluate_test {
namespace {

at::Tensor mse(const Batch& output, const Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

TEST(EvaluateTest, EveryScheduleGivesThePlainModelsOutputAndLoss) {
  const auto [input, target] = testing::distributed_batch();
  struct Case {
    ScheduleKind kind;
    int64_t stages_per_worker;
    bool skips;
  };
  const std::vector<Case> cases{
      {ScheduleKind::kGPipe, 1, false},
      {ScheduleKind::kOneFOneB, 1, true},
      {ScheduleKind::kInterleavedOneFOneB, 2, false},
      {ScheduleKind::kZeroBubble, 1, false},
      {ScheduleKind::kInterleavedZeroBubble, 2, true},
      {ScheduleKind::kLoopedBFS, 2, false},
      {ScheduleKind::kZeroBubbleV, 2, true},
      {ScheduleKind::kDualPipeV, 2, false},
      {ScheduleKind::kVMin, 2, true},
      {ScheduleKind::kVHalf, 2, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c10::str(c.kind, c.skips ? ", skips" : ""));
    std::vector<int64_t> balance = testing::distributed_balance(4 * c.stages_per_worker);
    auto plain = testing::distributed_model(balance, -1, "", false, c.skips);
    std::vector<at::Tensor> outputs;
    for (const auto& x : input.chunk(8)) outputs.push_back(plain->forward(x));
    const auto expected_output = torch::cat(outputs);
    const auto whole_batch_output = plain->forward(input);

    auto model = testing::distributed_model(balance, -1, "", false, c.skips);
    PipelineSchedule pipe(
        model, balance, mse,
        PipelineScheduleOptions(8).schedule(c.kind).stages_per_worker(c.stages_per_worker));
    // Before the first step.
    const Evaluation before = pipe.evaluate(input, target);
    ASSERT_TRUE(before.output);
    EXPECT_TRUE(testing::bitwise_equal(before.output->tensor(), expected_output));
    EXPECT_LE(testing::relative_difference(before.output->tensor(), whole_batch_output), 1e-12);
    EXPECT_FALSE(before.output->tensor().requires_grad());
    for (int64_t s = 0; s < pipe.num_stages(); ++s) EXPECT_EQ(pipe.peak_live_microbatches(s), 0);
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());

    // step() computes the same loss, and an evaluation between steps leaves its gradients.
    const auto loss = pipe.step(input, target);
    EXPECT_TRUE(testing::bitwise_equal(before.loss, loss));
    std::vector<at::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    const Evaluation between = pipe.evaluate(input, target);
    EXPECT_TRUE(testing::bitwise_equal(between.output->tensor(), expected_output));
    EXPECT_TRUE(testing::bitwise_equal(between.loss, loss));
    const auto parameters = model->parameters();
    for (size_t k = 0; k < parameters.size(); ++k) {
      EXPECT_TRUE(testing::bitwise_equal(parameters[k].grad(), grads[k])) << "parameter " << k;
    }
    EXPECT_TRUE(testing::bitwise_equal(pipe.step(input, target), loss));
  }
}

TEST(EvaluateTest, OutputsWithoutATarget) {
  std::vector<int64_t> balance = testing::distributed_balance(2);
  auto model = testing::distributed_model(balance);
  PipelineSchedule pipe(model, balance, mse, PipelineScheduleOptions(4));
  const auto [input, target] = testing::distributed_batch();
  const Evaluation evaluation = pipe.evaluate(input);
  EXPECT_FALSE(evaluation.loss.defined());
  ASSERT_TRUE(evaluation.output);
  EXPECT_EQ(evaluation.output->tensor().sizes(), target.sizes());
}

// A training step under no-grad would compute no gradient: refused, naming evaluate().
TEST(EvaluateTest, StepNeedsGradMode) {
  std::vector<int64_t> balance = testing::distributed_balance(2);
  auto model = testing::distributed_model(balance);
  PipelineSchedule pipe(model, balance, mse, PipelineScheduleOptions(4));
  const auto [input, target] = testing::distributed_batch();
  torch::NoGradGuard no_grad;
  GPIPE_EXPECT_THROW_WITH(pipe.step(input, target), c10::ValueError,
                          "step() trains, which needs grad mode");
}

}  // namespace
}  // namespace evaluate_test
}  // namespace schedule
}  // namespace gpipe

// Skip connections in explicit schedules: within a stage they work as in a plain Sequential;
// between stages they are refused up front, on threads and across processes.
#include "test_util.h"

#include <cstdlib>

#include "gpipe/distributed/pipeline_stage.h"
#include "gpipe/schedule/runtime.h"
#include "gpipe/skip/skippable.h"

namespace gpipe {
namespace schedule {
namespace {

using torch::nn::Sequential;

struct StashImpl : torch::nn::Module, skip::Skippable {
  StashImpl() : Skippable({"skip"}, {}) {}
  torch::Tensor forward(torch::Tensor input) {
    stash("skip", input);
    return input;
  }
};
TORCH_MODULE(Stash);

struct AddImpl : torch::nn::Module, skip::Skippable {
  AddImpl() : Skippable({}, {"skip"}) {}
  torch::Tensor forward(torch::Tensor input) { return input + pop("skip"); }
};
TORCH_MODULE(Add);

at::Tensor mse(const Batch& output, const Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

Sequential residual_model() {
  torch::manual_seed(0);
  auto model = Sequential(Stash(), torch::nn::Linear(4, 4), torch::nn::Tanh(), Add(),
                          torch::nn::Linear(4, 2));
  model->to(torch::kDouble);
  return model;
}

// residual_model() behind a Linear(4, 4): with balance {1, 4, 1} the skip lies in a middle
// stage, whose backward ZB1P splits.
Sequential prefixed_residual_model() {
  auto residual = residual_model();
  torch::manual_seed(1);
  Sequential model(torch::nn::Linear(4, 4));
  for (const auto& layer : *residual) model->push_back(layer);
  model->to(torch::kDouble);
  return model;
}

TEST(SkipScheduleTest, SkipWithinAStage) {
  const auto input = torch::randn({8, 4}, torch::kDouble);
  const auto target = torch::randn({8, 2}, torch::kDouble);
  for (const bool prefixed : {false, true}) {
    auto plain = prefixed ? prefixed_residual_model() : residual_model();
    const auto expected = torch::mse_loss(plain->forward(input), target);
    expected.backward();
    const std::vector<int64_t> balance =
        prefixed ? std::vector<int64_t>{1, 4, 1} : std::vector<int64_t>{4, 1};
    for (const auto kind :
         {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
      auto model = prefixed ? prefixed_residual_model() : residual_model();
      PipelineSchedule pipe(model, balance, mse, PipelineScheduleOptions(4).schedule(kind));
      EXPECT_TRUE(torch::allclose(pipe.step(input, target), expected, 1e-6, 1e-12)) << kind;
      const auto expected_parameters = plain->parameters();
      const auto parameters = model->parameters();
      for (size_t k = 0; k < parameters.size(); ++k) {
        EXPECT_TRUE(
            torch::allclose(parameters[k].grad(), expected_parameters[k].grad(), 1e-6, 1e-12))
            << kind << ", prefixed " << prefixed << ", parameter " << k;
      }
    }
  }
}

TEST(SkipScheduleTest, SkipBetweenStagesIsRefused) {
  GPIPE_EXPECT_THROW_WITH(
      PipelineSchedule(residual_model(), {2, 3}, mse, PipelineScheduleOptions(2)), c10::ValueError,
      "skip 'skip' is stashed in stage 0 and popped in stage 1, but explicit schedules carry skip "
      "connections only within a stage");
  // Across processes too, before the rendezvous (no rank 0 serves MASTER_PORT 1).
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1", 1);
  GPIPE_EXPECT_THROW_WITH(distributed::PipelineStage(residual_model(), {2, 3}, mse,
                                                     distributed::PipelineStageOptions(2)),
                          c10::ValueError,
                          "skip 'skip' is stashed in stage 0 and popped in stage 1, but explicit "
                          "schedules carry skip connections only within a stage");
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(name);
}

TEST(SkipScheduleTest, UnpairedSkipsAreRefused) {
  GPIPE_EXPECT_THROW_WITH(
      PipelineSchedule({Sequential(Stash(), torch::nn::Tanh()), Sequential(torch::nn::Tanh())}, mse,
                       PipelineScheduleOptions(2)),
      c10::TypeError, "no module declared 'skip' as poppable but stashed");
}

}  // namespace
}  // namespace schedule
}  // namespace gpipe

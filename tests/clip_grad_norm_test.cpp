// Tests of clipping by the global gradient norm on the schedule engines' threads: the total and
// the clipped gradients are bitwise what torch::nn::utils::clip_grad_norm_ gives for the same
// gradients, the tie counted once, and the plain model's (1e-12). (Ranks:
// distributed_recipes_test.cpp.)
#include "distributed_model.h"
#include "plain_reference.h"
#include "test_util.h"

#include "gpipe/schedule/runtime.h"

#include <torch/torch.h>

#include <limits>
#include <vector>

namespace gpipe {
namespace schedule {
namespace clip_grad_norm_test {
namespace {

at::Tensor mse(const Batch& output, const Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

// Fresh leaves holding copies of `parameters`' gradients.
std::vector<at::Tensor> with_copied_grads(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> copies;
  for (const auto& p : parameters) {
    auto copy = p.detach().clone().requires_grad_(true);
    copy.mutable_grad() = p.grad().clone();
    copies.push_back(copy);
  }
  return copies;
}

TEST(ClipGradNormTest, EqualsThePlainClip) {
  const auto [input, target] = testing::tied_batch();
  const double infinity = std::numeric_limits<double>::infinity();
  for (const double norm_type : {2.0, 1.0, 3.5, infinity, 0.0}) {
    for (const auto kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleV}) {
      SCOPED_TRACE(c10::str(kind, ", norm type ", norm_type));
      const int64_t stages_per_worker = kind == ScheduleKind::kZeroBubbleV ? 2 : 1;
      auto model = testing::tied_model();
      PipelineSchedule pipe(
          model, testing::distributed_balance(2 * stages_per_worker), mse,
          PipelineScheduleOptions(4).schedule(kind).stages_per_worker(stages_per_worker));
      pipe.step(input, target);
      const auto parameters = pipe.parameters();
      // The same gradients, clipped by LibTorch: bitwise the same.
      const auto copies = with_copied_grads(parameters);
      const double expected = torch::nn::utils::clip_grad_norm_(copies, 0.5, norm_type);
      const double total = pipe.clip_grad_norm(0.5, norm_type);
      EXPECT_EQ(total, expected);
      for (size_t k = 0; k < parameters.size(); ++k) {
        EXPECT_TRUE(testing::bitwise_equal(parameters[k].grad(), copies[k].grad()))
            << "parameter " << k;
      }
      // The plain model's, whose gradients round a little differently.
      auto plain = testing::tied_model();
      torch::mse_loss(plain->forward(input), target).backward();
      std::vector<at::Tensor> plain_parameters = plain->parameters();
      plain_parameters.pop_back();  // the tie, listed twice
      const double plain_total =
          torch::nn::utils::clip_grad_norm_(plain_parameters, 0.5, norm_type);
      EXPECT_NEAR(total, plain_total, 1e-12 * plain_total);
      for (size_t k = 0; k < parameters.size(); ++k) {
        EXPECT_LE(testing::relative_difference(parameters[k].grad(), plain_parameters[k].grad()),
                  1e-12)
            << "parameter " << k;
      }
    }
  }
}

TEST(ClipGradNormTest, ChecksItsArguments) {
  auto model = testing::tied_model();
  PipelineSchedule pipe(model, testing::distributed_balance(2), mse, PipelineScheduleOptions(4));
  EXPECT_EQ(pipe.clip_grad_norm(1.0), 0.0);  // no gradients yet
  GPIPE_EXPECT_THROW_WITH(pipe.clip_grad_norm(-1.0), c10::ValueError,
                          "max_norm must be non-negative, but got -1");
  GPIPE_EXPECT_THROW_WITH(pipe.clip_grad_norm(1.0, -2.0), c10::ValueError,
                          "norm_type must be non-negative, but got -2");
  const auto [input, target] = testing::tied_batch();
  pipe.step(input, target);
  pipe.parameters()[1].mutable_grad()[0][0] = std::numeric_limits<double>::infinity();
  const auto before = pipe.parameters()[2].grad().clone();
  GPIPE_EXPECT_THROW_WITH(pipe.clip_grad_norm(1.0, 2.0, /*error_if_nonfinite=*/true), c10::Error,
                          "is non-finite, so it cannot be clipped");
  EXPECT_TRUE(testing::bitwise_equal(pipe.parameters()[2].grad(), before));
}

}  // namespace
}  // namespace clip_grad_norm_test
}  // namespace schedule
}  // namespace gpipe

// Tests of GradScaler: it scales, unscales, skips and grows or backs off as torch.amp.GradScaler,
// keeps its state in an archive, and in the schedule engines gives the unscaled gradients
// exactly (a power-of-two scale) and skips the step in which any stage overflowed. (Ranks:
// distributed_recipes_test.cpp.)
#include "distributed_model.h"
#include "plain_reference.h"
#include "test_util.h"

#include "gpipe/amp/grad_scaler.h"
#include "gpipe/schedule/runtime.h"

#include <torch/torch.h>

#include <limits>
#include <memory>
#include <sstream>
#include <vector>

namespace gpipe {
namespace amp {
namespace grad_scaler_test {
namespace {

const double kInfinity = std::numeric_limits<double>::infinity();

// A parameter with gradient `grad`.
at::Tensor with_grad(double grad) {
  auto p = torch::zeros({2}, torch::requires_grad());
  p.mutable_grad() = torch::full({2}, grad);
  return p;
}

TEST(GradScalerTest, GrowsAndBacksOffAsTorchAmp) {
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(2));
  EXPECT_EQ(scaler.scale(), 8);
  // Two clean steps grow it; an overflow halves it and starts the count again.
  const std::vector<bool> overflows{false, false, false, true, false, false};
  const std::vector<double> scales{8, 16, 16, 8, 8, 16};
  const std::vector<int64_t> trackers{1, 0, 1, 0, 1, 0};
  for (size_t k = 0; k < overflows.size(); ++k) {
    const auto p = with_grad(overflows[k] ? kInfinity : scaler.scale());
    scaler.unscale({p});
    EXPECT_EQ(scaler.found_inf(), overflows[k]) << "step " << k;
    if (!overflows[k]) EXPECT_TRUE(torch::equal(p.grad(), torch::ones({2})));
    scaler.update();
    EXPECT_EQ(scaler.scale(), scales[k]) << "step " << k;
    EXPECT_EQ(scaler.growth_tracker(), trackers[k]) << "step " << k;
    EXPECT_FALSE(scaler.found_inf());
  }
  // A grown scale that would not be finite in float32 stays.
  GradScaler huge(GradScalerOptions().init_scale(3e38).growth_interval(1));
  huge.update();
  EXPECT_EQ(huge.scale(), static_cast<double>(3e38f));
}

TEST(GradScalerTest, SkipsTheOptimizerStepAfterAnOverflow) {
  auto p = with_grad(std::nan(""));
  torch::optim::SGD sgd({p}, 0.5);
  GradScaler scaler;
  EXPECT_TRUE(torch::equal(scaler.scale(torch::ones({})), torch::full({}, 65536.0)));
  scaler.unscale({p});
  EXPECT_FALSE(scaler.step(sgd));
  EXPECT_TRUE(torch::equal(p, torch::zeros({2})));
  scaler.update();
  EXPECT_EQ(scaler.scale(), 32768);
  p.mutable_grad() = torch::full({2}, 32768.0);
  // Another rank's overflow counts too.
  scaler.unscale({p}, [](bool found) { return true; });
  EXPECT_FALSE(scaler.step(sgd));
  scaler.update();
  p.mutable_grad() = torch::full({2}, 16384.0);
  scaler.unscale({p}, [](bool found) { return found; });
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_TRUE(torch::equal(p, torch::full({2}, -0.5)));
}

TEST(GradScalerTest, DisabledChangesNothing) {
  auto p = with_grad(kInfinity);
  torch::optim::SGD sgd({p}, 0.5);
  GradScaler scaler(GradScalerOptions().enabled(false));
  EXPECT_EQ(scaler.scale(), 1);
  scaler.unscale({p});
  EXPECT_FALSE(scaler.found_inf());
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(scaler.scale(), 1);
}

TEST(GradScalerTest, ChecksOptionsAndGradients) {
  GPIPE_EXPECT_THROW_WITH(GradScaler(GradScalerOptions().init_scale(0)), c10::ValueError,
                          "init_scale must be positive and finite, but got 0");
  GPIPE_EXPECT_THROW_WITH(GradScaler(GradScalerOptions().growth_factor(1)), c10::ValueError,
                          "growth_factor must be more than 1, but got 1");
  GPIPE_EXPECT_THROW_WITH(GradScaler(GradScalerOptions().backoff_factor(1)), c10::ValueError,
                          "backoff_factor must be in (0, 1), but got 1");
  GPIPE_EXPECT_THROW_WITH(GradScaler(GradScalerOptions().growth_interval(0)), c10::ValueError,
                          "growth_interval must be positive, but got 0");
  auto half = torch::zeros({2}, torch::TensorOptions().dtype(torch::kHalf).requires_grad(true));
  half.mutable_grad() = torch::ones({2}, torch::kHalf);
  GradScaler scaler;
  GPIPE_EXPECT_THROW_WITH(scaler.unscale({half}), c10::ValueError,
                          "cannot unscale float16 gradients");
}

TEST(GradScalerTest, SavesAndLoadsItsState) {
  GradScaler scaler(GradScalerOptions().init_scale(64).growth_interval(3));
  scaler.update();
  scaler.unscale({with_grad(kInfinity)});
  scaler.update();
  scaler.update();
  torch::serialize::OutputArchive out;
  scaler.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);

  GradScaler loaded(GradScalerOptions().growth_interval(3));
  torch::serialize::InputArchive in;
  std::istringstream read(bytes.str());
  in.load_from(read);
  loaded.load(in);
  EXPECT_EQ(loaded.scale(), 32);
  EXPECT_EQ(loaded.growth_tracker(), 1);

  GradScaler other(GradScalerOptions().growth_interval(5));
  torch::serialize::InputArchive again;
  std::istringstream reread(bytes.str());
  again.load_from(reread);
  GPIPE_EXPECT_THROW_WITH(other.load(again), c10::ValueError,
                          "the saved grad scaler has growth_interval 3, this one 5");
}

at::Tensor mse(const Batch& output, const Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

// The step's losses are scaled by a power of two and its gradients unscaled: bitwise those of a
// pipeline without a scaler. When two steps accumulate, the second step's gradients are summed
// before they join the first's: the same within float64 rounding.
TEST(GradScalerTest, PipelineGradientsAreUnscaledExactly) {
  const auto [input, target] = testing::distributed_batch();
  for (const auto kind :
       {schedule::ScheduleKind::kOneFOneB, schedule::ScheduleKind::kZeroBubbleV}) {
    SCOPED_TRACE(c10::str(kind));
    const int64_t stages_per_worker = kind == schedule::ScheduleKind::kZeroBubbleV ? 2 : 1;
    std::vector<int64_t> balance = testing::distributed_balance(2 * stages_per_worker);
    const auto options =
        schedule::PipelineScheduleOptions(4).schedule(kind).stages_per_worker(stages_per_worker);
    auto plain = testing::distributed_model(balance);
    schedule::PipelineSchedule unscaled(plain, balance, mse, options);
    auto model = testing::distributed_model(balance);
    auto scaler = std::make_shared<GradScaler>();
    schedule::PipelineSchedule scaled(
        model, balance, mse, schedule::PipelineScheduleOptions(options).grad_scaler(scaler));
    for (int step = 0; step < 2; ++step) {
      EXPECT_TRUE(testing::bitwise_equal(scaled.step(input, target), unscaled.step(input, target)));
      const auto expected = plain->parameters();
      const auto actual = model->parameters();
      for (size_t k = 0; k < actual.size(); ++k) {
        if (step == 0) {
          EXPECT_TRUE(testing::bitwise_equal(actual[k].grad(), expected[k].grad()))
              << "parameter " << k;
        } else {
          EXPECT_LE(testing::relative_difference(actual[k].grad(), expected[k].grad()), 1e-14)
              << "accumulated, parameter " << k;
        }
      }
    }
    EXPECT_FALSE(scaler->found_inf());
  }
}

// An infinite gradient in the last stage: the scaler finds it, the optimizer step is skipped
// and the scale backs off; the next step trains.
TEST(GradScalerTest, AnOverflowInOneStageSkipsTheStep) {
  const auto [input, target] = testing::distributed_batch();
  std::vector<int64_t> balance = testing::distributed_balance(2);
  auto model = testing::distributed_model(balance);
  auto scaler = std::make_shared<GradScaler>(GradScalerOptions().init_scale(1024));
  schedule::PipelineSchedule pipe(model, balance, mse,
                                  schedule::PipelineScheduleOptions(4).grad_scaler(scaler));
  torch::optim::SGD sgd(pipe.parameters(), 0.1);
  auto last = pipe.parameters().back();
  const unsigned hook = last.register_hook([](at::Tensor grad) { return grad * kInfinity; });
  const auto before = pipe.parameters().front().clone();
  pipe.step(input, target);
  last.remove_hook(hook);
  EXPECT_TRUE(scaler->found_inf());
  EXPECT_FALSE(scaler->step(sgd));
  scaler->update();
  EXPECT_EQ(scaler->scale(), 512);
  EXPECT_TRUE(torch::equal(pipe.parameters().front(), before));
  sgd.zero_grad();
  pipe.step(input, target);
  EXPECT_FALSE(scaler->found_inf());
  EXPECT_TRUE(scaler->step(sgd));
  EXPECT_FALSE(torch::equal(pipe.parameters().front(), before));
}

}  // namespace
}  // namespace grad_scaler_test
}  // namespace amp
}  // namespace gpipe

// Tests of activation memory under explicit schedules: 1F1B and ZB1P hold at most K (number of
// stages) micro-batches of activations in stage 0, GPipe all M, measured with the tracking
// allocator.
#include "test_util.h"

#include "gpipe/memory.h"
#include "gpipe/schedule/runtime.h"

namespace gpipe {
namespace schedule {
namespace schedule_memory_test {
namespace {

constexpr int64_t kStages = 2;
constexpr int64_t kChunks = 8;
constexpr int64_t kRows = 64;    // per micro-batch
constexpr int64_t kWide = 4096;  // stage 0's hidden width: its activations dominate
constexpr int64_t kUnit = kRows * kWide * sizeof(float);  // one micro-batch's hidden activation

at::Tensor mse(const Batch& output, const Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

// The peak of CPU tensor memory during one step, above what was allocated before it.
int64_t step_peak(ScheduleKind kind, int64_t* live) {
  torch::manual_seed(0);
  torch::nn::Sequential stage0(torch::nn::Linear(4, kWide), torch::nn::Tanh(),
                               torch::nn::Linear(kWide, 4));
  torch::nn::Sequential stage1(torch::nn::Linear(4, 4));
  PipelineSchedule pipe({stage0, stage1}, mse, PipelineScheduleOptions(kChunks).schedule(kind));
  const at::Tensor input = torch::randn({kRows * kChunks, 4});
  const at::Tensor target = torch::randn({kRows * kChunks, 4});
  pipe.step(input, target);  // allocates the gradients
  const int64_t before = memory::cpu_current_bytes();
  memory::reset_cpu_peak();
  pipe.step(input, target);
  *live = pipe.peak_live_microbatches(0);
  return memory::cpu_peak_bytes() - before;
}

TEST(ScheduleMemoryTest, OneFOneBHoldsAtMostKMicroBatchesInStageZero) {
  memory::install_tracking_cpu_allocator();
  int64_t gpipe_live = 0, one_f_one_b_live = 0;
  const int64_t gpipe = step_peak(ScheduleKind::kGPipe, &gpipe_live);
  const int64_t one_f_one_b = step_peak(ScheduleKind::kOneFOneB, &one_f_one_b_live);
  EXPECT_EQ(gpipe_live, kChunks);
  EXPECT_EQ(one_f_one_b_live, kStages);
  // GPipe keeps M hidden activations; 1F1B K of them plus the transients of one forward or
  // backward (at most two more).
  EXPECT_GE(gpipe, kChunks * kUnit) << "GPipe peak " << gpipe << " bytes";
  EXPECT_LE(one_f_one_b, (kStages + 2) * kUnit + kUnit / 2) << "1F1B peak " << one_f_one_b;
  std::cout << "peak activation memory, " << kChunks << " micro-batches of " << kUnit
            << " bytes each: GPipe " << gpipe << " bytes, 1F1B " << one_f_one_b << " bytes\n";
}

TEST(ScheduleMemoryTest, ZeroBubbleHoldsAtMostKMicroBatchesInStageZero) {
  memory::install_tracking_cpu_allocator();
  int64_t live = 0;
  const int64_t zero_bubble = step_peak(ScheduleKind::kZeroBubble, &live);
  EXPECT_EQ(live, kStages);
  // Like 1F1B: K graphs kept until their weight pass, plus one pass's transients.
  EXPECT_LE(zero_bubble, (kStages + 2) * kUnit + kUnit / 2) << "ZB1P peak " << zero_bubble;
  std::cout << "peak activation memory, ZB1P: " << zero_bubble << " bytes\n";
}

}  // namespace
}  // namespace schedule_memory_test
}  // namespace schedule
}  // namespace gpipe

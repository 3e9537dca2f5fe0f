// Tests of V-Min and V-Half (generators.h): valid V schedules that hold at most the paper's
// bound, less than ZBV, and whose step with unit costs is what their building block makes it.
#include "test_util.h"

#include "held_microbatches.h"

#include "gpipe/schedule/action.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/predict.h"
#include "gpipe/schedule/validate.h"

#include <algorithm>
#include <map>
#include <utility>

namespace gpipe {
namespace schedule {
namespace schedule_v_memory_test {
namespace {

using K = ActionKind;

// The documented bounds on what a worker holds at once, in micro-batches of its half-size
// stages: the paper's (W + 4) / 3 and (W + 2) / 2 micro-batches of whole stages.
int64_t v_min_bound(int64_t W) { return 2 * ((W + 4) / 3); }
int64_t v_half_bound(int64_t W) { return 2 * ((W + 2) / 2); }

using testing::most_held;

// predict()'s peaks of worker w's two stages, added (they may come at different times).
int64_t stage_peaks(const Prediction& p, int64_t W, int64_t w) {
  return p.peak_live_microbatches[w] + p.peak_live_microbatches[2 * W - 1 - w];
}

// The fullest worker's stage_peaks with unit costs.
int64_t fullest_worker(const Schedule& schedule) {
  const int64_t W = schedule.num_workers;
  const Prediction p = predict(schedule, ActionCosts::unit(2 * W));
  int64_t most = 0;
  for (int64_t w = 0; w < W; ++w) most = std::max(most, stage_peaks(p, W, w));
  return most;
}

struct Kind {
  const char* name;
  Schedule (*generate)(int64_t, int64_t);
  int64_t (*bound)(int64_t);
};
const Kind kKinds[] = {{"v_min", v_min_schedule, v_min_bound},
                       {"v_half", v_half_schedule, v_half_bound}};

// Worker w runs stages w and 2W - 1 - w, each stage every micro-batch's F, B and W once; a worker
// holds at most the bound at once, and its two stages' peaks add up to at most one more.
TEST(ScheduleVMemoryTest, RunAVAndHoldAtMostTheBound) {
  for (const Kind& kind : kKinds) {
    for (int64_t W = 1; W <= 8; ++W) {
      for (const int64_t m : {int64_t{1}, int64_t{2}, W, 2 * W + 1, 4 * W}) {
        SCOPED_TRACE(c10::str(kind.name, ", ", W, " workers, ", m, " micro-batches"));
        const Schedule schedule = kind.generate(W, m);
        EXPECT_EQ(schedule.placement, Placement::kV);
        EXPECT_EQ(schedule.num_stages, 2 * W);
        for (const int64_t capacity : {int64_t{0}, m}) {
          EXPECT_NO_THROW(validate(schedule, ValidateOptions().queue_capacity(capacity)));
        }
        const Prediction p = predict(schedule, ActionCosts::unit(2 * W));
        for (int64_t w = 0; w < W; ++w) {
          std::map<std::pair<int64_t, K>, int64_t> counts;  // per (stage, kind)
          for (const Action& a : schedule.actions[w]) {
            EXPECT_TRUE(a.stage == w || a.stage == 2 * W - 1 - w) << "worker " << w << ": " << a;
            ++counts[{a.stage, a.kind}];
          }
          for (const int64_t s : {w, 2 * W - 1 - w}) {
            for (const K k : {K::kForward, K::kBackwardInput, K::kBackwardWeight}) {
              EXPECT_EQ((counts[{s, k}]), m) << "stage " << s << ", " << k;
            }
          }
          EXPECT_LE(most_held(schedule.actions[w]), kind.bound(W)) << "worker " << w;
          EXPECT_LE(stage_peaks(p, W, w), kind.bound(W) + 1) << "worker " << w;
        }
      }
    }
  }
}

// Less than ZBV (and 1F1B's first stage: 2W micro-batches of half-size stages) from 3 workers on;
// V-Min less than V-Half from 4.
TEST(ScheduleVMemoryTest, HoldLessThanZbv) {
  for (const int64_t W : {3, 4, 8}) {
    for (const int64_t m : {2 * W, 4 * W}) {
      SCOPED_TRACE(c10::str(W, " workers, ", m, " micro-batches"));
      const int64_t zbv = fullest_worker(zbv_schedule(W, m));
      const int64_t v_min = fullest_worker(v_min_schedule(W, m));
      const int64_t v_half = fullest_worker(v_half_schedule(W, m));
      EXPECT_LT(v_half, zbv);
      EXPECT_LT(v_half_bound(W), 2 * W);
      if (W >= 4) EXPECT_LT(v_min, v_half);
    }
  }
}

// V-Min's step with unit costs is its repeated block's length: the last block starts at tick
// 6(M - 1), worker 0's last input gradient is its tick 4W - 1 (2 more where 3 divides W) and its
// weight gradient follows, 6M + 4W - 5 (+2) in all; each worker computes 6M of it, the rest is
// bubble, about 2W / 3M as the paper says.
TEST(ScheduleVMemoryTest, VMinStepIsItsBlocksLength) {
  for (int64_t W = 2; W <= 8; ++W) {
    for (int64_t m = 2; m <= 4 * W; ++m) {
      SCOPED_TRACE(c10::str(W, " workers, ", m, " micro-batches"));
      const double idle = 4.0 * W - 5 + (W % 3 == 0 ? 2 : 0);
      const Prediction p = predict(v_min_schedule(W, m), ActionCosts::unit(2 * W));
      EXPECT_DOUBLE_EQ(p.step_time, 6.0 * m + idle);
      EXPECT_NEAR(p.bubble_fraction, idle / (6.0 * m + idle), 1e-12);
    }
  }
}

// V-Half's bubble with unit costs: at most the paper's W / 2M (3W idle ticks beside a worker's
// 6M), below V-Min's, above ZBV's W - 1; measured, 3W - 3 idle ticks for even W, 3W - 4 for odd
// (docs/schedules.md).
TEST(ScheduleVMemoryTest, VHalfBubbleIsThePapers) {
  for (int64_t W = 2; W <= 8; ++W) {
    for (int64_t m = W; m <= 4 * W; ++m) {
      SCOPED_TRACE(c10::str(W, " workers, ", m, " micro-batches"));
      const auto unit = ActionCosts::unit(2 * W);
      const double idle = predict(v_half_schedule(W, m), unit).step_time - 6.0 * m;
      EXPECT_LE(idle, 3.0 * W);
      EXPECT_LE(idle, predict(v_min_schedule(W, m), unit).step_time - 6.0 * m);
      EXPECT_GT(idle, W - 1.0);
      EXPECT_EQ(idle, 3.0 * W - 3 - W % 2);
    }
  }
}

TEST(ScheduleVMemoryTest, RefuseBadCounts) {
  GPIPE_EXPECT_THROW_WITH(v_min_schedule(0, 4), c10::ValueError,
                          "num_workers must be positive, but got 0");
  GPIPE_EXPECT_THROW_WITH(v_half_schedule(-1, 4), c10::ValueError,
                          "num_workers must be positive, but got -1");
  GPIPE_EXPECT_THROW_WITH(v_half_schedule(2, 0), c10::ValueError,
                          "num_microbatches must be positive, but got 0");
  GPIPE_EXPECT_THROW_WITH(make_schedule(ScheduleKind::kVMin, 2, 3, 4), c10::ValueError,
                          "schedule v_min runs two stages per worker in a V, but got 3 stages for "
                          "2 workers");
  GPIPE_EXPECT_THROW_WITH(make_schedule(ScheduleKind::kVHalf, 0, 0, 4), c10::ValueError,
                          "num_workers must be positive, but got 0");
  for (const ScheduleKind kind : {ScheduleKind::kVMin, ScheduleKind::kVHalf}) {
    EXPECT_EQ(parse_schedule_kind(c10::str(kind)), kind);
    EXPECT_EQ(placement_of(kind), Placement::kV);
    EXPECT_TRUE(splits_backward(kind));
    EXPECT_EQ(min_microbatches(kind, 8), 1);
    EXPECT_EQ(make_schedule(kind, 3, 6, 1).placement, Placement::kV);
  }
}

}  // namespace
}  // namespace schedule_v_memory_test
}  // namespace schedule
}  // namespace gpipe

// Tests of the text rendering of schedules.
#include "test_util.h"

#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/render.h"

namespace gpipe {
namespace schedule {
namespace schedule_render_test {
namespace {

TEST(ScheduleRenderTest, OneFOneB) {
  EXPECT_EQ(render(one_f_one_b_schedule(2, 3)),
            "worker 0 | F0 F1 .  B0 F2 B1 .  B2\n"
            "worker 1 | .  F0 B0 F1 B1 F2 B2\n");
}

TEST(ScheduleRenderTest, ZeroBubble) {
  // W passes fill what 1F1B leaves idle: 10 rounds for 3 forwards and 6 backward halves.
  EXPECT_EQ(render(zb1p_schedule(2, 3)),
            "worker 0 | F0 F1 .  B0 W0 F2 B1 W1 B2 W2\n"
            "worker 1 | .  F0 B0 F1 B1 W0 F2 B2 W1 W2\n");
}

TEST(ScheduleRenderTest, GPipe) {
  EXPECT_EQ(render(gpipe_schedule(2, 2)),
            "worker 0 | F0 F1 .  .  B0 B1\n"
            "worker 1 | .  F0 F1 B0 B1\n");
}

TEST(ScheduleRenderTest, InterleavedNamesStages) {
  const std::string text = render(interleaved_one_f_one_b_schedule(2, 2, 2));
  EXPECT_THAT(text, ::testing::StartsWith("worker 0 | F0:0 F1:0 F0:2"));
  EXPECT_THAT(text, ::testing::HasSubstr("\nworker 1 | .    F0:1"));
}

TEST(ScheduleRenderTest, ZbvNamesStages) {
  // Worker 0 runs stages 0 and 3, worker 1 stages 1 and 2: the V turns on worker 1.
  EXPECT_EQ(render(zbv_schedule(2, 2)),
            "worker 0 | F0:0 F1:0 .    F0:3 B0:3 F1:3 B1:3 B0:0 W0:3 B1:0 W0:0 W1:3 W1:0\n"
            "worker 1 | .    F0:1 F0:2 F1:1 F1:2 B0:2 B0:1 B1:2 B1:1 W0:2 W0:1 W1:2 W1:1\n");
}

TEST(ScheduleRenderTest, DualPipeVPairsForwardsWithBackwards) {
  // The steady state pairs F0:0 with B of stage 3 and F of stage 3 with B of stage 0 on worker 0;
  // B is a whole backward or, where a W of the cell follows, its input half.
  EXPECT_EQ(render(dualpipev_schedule(2, 4)),
            "worker 0 | F0:0 F1:0 F2:0 F0:3 B0:3 W0:3 F1:3 F3:0 B1:3 F2:3 B0:0 B2:3 F3:3 B1:0 B3:3 "
            "B2:0 W2:0 B3:0 W3:0\n"
            "worker 1 | .    F0:1 F0:2 F1:1 F1:2 F2:1 B0:2 F2:2 B0:1 F3:1 B1:2 F3:2 B1:1 B2:2 B2:1 "
            "B3:2 B3:1 W3:2 W3:1\n");
}

TEST(ScheduleRenderTest, RejectsInvalidSchedule) {
  Schedule schedule = gpipe_schedule(2, 1);
  schedule.actions[1].erase(schedule.actions[1].begin());
  GPIPE_EXPECT_THROW_WITH(render(schedule), c10::ValueError, "Forward(microbatch=0, stage=1)");
}

}  // namespace
}  // namespace schedule_render_test
}  // namespace schedule
}  // namespace gpipe

// Tests of schedules as text (schedule_file.h): every generated schedule reads back as written,
// hand-written and PyTorch-written files read as they mean, and broken ones are refused naming
// the line.
#include "test_util.h"

#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/schedule_file.h"

#include <cstdio>
#include <fstream>
#include <string>

namespace gpipe {
namespace schedule {
namespace schedule_file_test {
namespace {

void expect_same(const Schedule& actual, const Schedule& expected) {
  EXPECT_EQ(actual.num_workers, expected.num_workers);
  EXPECT_EQ(actual.num_stages, expected.num_stages);
  EXPECT_EQ(actual.num_microbatches, expected.num_microbatches);
  // One worker runs every stage under either placement.
  for (int64_t s = 0; s < expected.num_stages; ++s) {
    EXPECT_EQ(actual.worker_of(s), expected.worker_of(s)) << "stage " << s;
  }
  EXPECT_EQ(actual.actions, expected.actions);
}

TEST(ScheduleFileTest, EveryGeneratedScheduleReadsBackAsWritten) {
  for (const auto& name : schedule_names()) {
    const ScheduleKind kind = parse_schedule_kind(name);
    for (int64_t workers = 1; workers <= 4; ++workers) {
      const int64_t stages =
          loops_stages(kind) || placement_of(kind) == Placement::kV ? 2 * workers : workers;
      for (int64_t m = min_microbatches(kind, stages); m <= 8; ++m) {
        SCOPED_TRACE(c10::str(name, ", ", workers, " workers, ", m, " micro-batches"));
        const Schedule schedule = make_schedule(kind, workers, stages, m);
        const std::string text = write_schedule(schedule);
        expect_same(parse_schedule(text), schedule);
        // Generated schedules place their sends and receives as with_communication() does, so
        // the text holds the compute actions only.
        EXPECT_EQ(text.find("SEND"), std::string::npos) << text;
      }
    }
  }
}

TEST(ScheduleFileTest, WritesComputeActionsInPyTorchNotation) {
  EXPECT_EQ(write_schedule(zbv_schedule(1, 2)),
            "# 1 workers, 2 stages (V), 2 micro-batches; sends and receives as the generators "
            "place them\n"
            "worker 0: 0F0 1F0 1I0 0I0 1W0 0F1 0W0 1F1 1I1 0I1 1W1 0W1\n");
  EXPECT_EQ(compact({ActionKind::kSendActivation, 3, 12}), "12SEND_F3");
  EXPECT_EQ(compact({ActionKind::kRecvGradient, 0, 1}), "1RECV_B0");
}

TEST(ScheduleFileTest, ReadsAHandWrittenSchedule) {
  // The example of schedule_file.h, with comments, blank lines and no labels on one line.
  const Schedule schedule = parse_schedule(
      "# 1F1B on 2 stages\n"
      "\n"
      "worker 0: 0F0 0F1 0B0 0F2 0B1 0B2   # stage 0\n"
      "1F0 1B0 1F1 1B1 1F2 1B2\n");
  expect_same(schedule, one_f_one_b_schedule(2, 3));
}

TEST(ScheduleFileTest, ReadsPyTorchFiles) {
  // torch.distributed.pipelining's CSV: a row per rank, actions separated by commas, empty cells
  // where a rank idles, sends and receives written out.
  const Schedule lowered = parse_schedule(
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
  EXPECT_EQ(lowered.actions[1][0], (Action{ActionKind::kRecvActivation, 0, 1}));
  EXPECT_EQ(lowered.actions[1][3], (Action{ActionKind::kSendGradient, 0, 1}));
  EXPECT_EQ(lowered.num_microbatches, 2);
  // Compute only, split backwards: I the input half, W the weight half.
  const Schedule split = parse_schedule(
      "0F0,0F1,,0I0,0W0,0F2,0I1,0W1,0I2,0W2\n"
      ",1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1W2\n");
  expect_same(split, zb1p_schedule(2, 3));
  // Older files write the input half as B: B and W of one micro-batch read as I and W.
  const Schedule old = parse_schedule(
      "0F0,0F1,,0B0,0W0,0F2,0B1,0W1,0B2,0W2\n"
      ",1F0,1B0,1F1,1B1,1W0,1F2,1B2,1W1,1W2\n");
  expect_same(old, zb1p_schedule(2, 3));
}

TEST(ScheduleFileTest, PlacementIsLoopedOrV) {
  EXPECT_EQ(parse_schedule("0F0 2F0 2B0 0B0\n1F0 3F0 3B0 1B0\n").placement, Placement::kLooped);
  EXPECT_EQ(parse_schedule("0F0 3F0 3B0 0B0\n1F0 2F0 2B0 1B0\n").placement, Placement::kV);
  GPIPE_EXPECT_THROW_WITH(
      parse_schedule("0F0 1F0 1B0 0B0\n2F0 2B0\n3F0 3B0\n", "s.txt"), c10::ValueError,
      "s.txt: the stages are placed neither looped (stage s on worker s % 3) nor in a V (6 "
      "stages, worker w running stages w and 5 - w): stage 1 on line 1 (worker 0) breaks the "
      "first, 4 stages the second");
  GPIPE_EXPECT_THROW_WITH(parse_schedule("0F0 1B0\n1F0 0B0\n", "s.txt"), c10::ValueError,
                          "s.txt: stage 1 has actions on line 1 (worker 0) and on line 2 "
                          "(worker 1), but a stage runs on one worker");
}

// A typo, a missing backward and a deadlock: each refused naming the file and the line.
TEST(ScheduleFileTest, RefusesBrokenFilesNamingTheLine) {
  GPIPE_EXPECT_THROW_WITH(
      parse_schedule("# 1F1B\nworker 0: 0F0 0B0\nworker 1: 1F0 1X0\n", "s.txt"), c10::ValueError,
      "s.txt, line 3: '1X0' is not an action: expected <stage><kind><micro-batch> with kind F, B, "
      "I, W, SEND_F, RECV_F, SEND_B or RECV_B (e.g. 2F1: the forward of micro-batch 1 on stage "
      "2)");
  GPIPE_EXPECT_THROW_WITH(
      parse_schedule("0F0 0F1 0B0\n\n1F0 1B0 1F1 1B1\n", "s.txt"), c10::ValueError,
      "s.txt: invalid schedule: it never runs Backward(microbatch=1, stage=0) (a stage of line 1 "
      "(worker 0))");
  // Stage 0 waits for the gradient of micro-batch 0 before it sends micro-batch 1's activation,
  // which stage 1 waits for before it computes that gradient.
  GPIPE_EXPECT_THROW_WITH(
      parse_schedule("0F0 0B0 0F1 0B1\n1F1 1B1 1F0 1B0\n", "s.txt"), c10::ValueError,
      "s.txt: invalid schedule: line 2 (worker 1), action 0, RecvActivation(microbatch=1, "
      "stage=1): the next activation from stage 0 is of micro-batch 0, not 1");
  GPIPE_EXPECT_THROW_WITH(parse_schedule("0F0 0SEND_F0 0RECV_B0 0B0\n1RECV_F0 1F0 1B0\n", "s.txt"),
                          c10::ValueError,
                          "s.txt: invalid schedule: deadlock: line 1 (worker 0) waits at action 2, "
                          "RecvGradient(microbatch=0, stage=0)");
  GPIPE_EXPECT_THROW_WITH(parse_schedule("worker 1: 0F0 0B0\n", "s.txt"), c10::ValueError,
                          "s.txt, line 1: 'worker 1:' labels the line of worker 0, which reads "
                          "'worker 0:' (lines of actions are workers 0, 1, ... in order)");
  GPIPE_EXPECT_THROW_WITH(parse_schedule("0UNSHARD 0F0 0B0\n", "s.txt"), c10::ValueError,
                          "s.txt, line 1: '0UNSHARD': UNSHARD and RESHARD (FSDP in "
                          "torch.distributed.pipelining) are not actions of gpipe's schedules");
  GPIPE_EXPECT_THROW_WITH(parse_schedule("# nothing\n", "s.txt"), c10::ValueError,
                          "s.txt holds no actions");
  GPIPE_EXPECT_THROW_WITH(parse_schedule("0F9999999999 0B0\n", "s.txt"), c10::ValueError,
                          "'0F9999999999' is not an action");
}

TEST(ScheduleFileTest, ReadsFiles) {
  const std::string path = ::testing::TempDir() + "gpipe_schedule_file_test.txt";
  std::ofstream(path) << write_schedule(zbv_schedule(2, 4));
  expect_same(read_schedule_file(path), zbv_schedule(2, 4));
  std::remove(path.c_str());
  GPIPE_EXPECT_THROW_WITH(read_schedule_file(path), c10::ValueError,
                          "cannot read the schedule file " + path);
}

}  // namespace
}  // namespace schedule_file_test
}  // namespace schedule
}  // namespace gpipe

// Tests of PipelineStage across processes: for 2 and 4 ranks and every schedule, and for 2
// replicas of 2-rank pipelines, the loss and the gradients equal the plain model's on the full
// batch (1e-6); bad layouts fail at the start.
#include "test_util.h"

#include "distributed_launch.h"
#include "distributed_model.h"
#include "gpipe/distributed/pipeline_stage.h"
#include "gpipe/schedule/schedule_file.h"
#include "trace_merge.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace gpipe {
namespace distributed {
namespace distributed_pipeline_test {
namespace {

bool close(const at::Tensor& actual, const at::Tensor& expected) {
  return actual.defined() && expected.defined() && actual.sizes() == expected.sizes() &&
         torch::allclose(actual, expected, /*rtol=*/1e-6, /*atol=*/1e-12);
}

// Runs the worker on `ranks` ranks and compares every rank's loss and every stage's gradients
// with the plain model's.
void expect_equivalent(int ranks, const std::string& schedule, int64_t stages_per_worker,
                       int64_t replicas = 1, const std::string& checkpoint = "never",
                       int64_t chunks = 4, const std::string& flags = "", bool skips = false) {
  SCOPED_TRACE(std::to_string(ranks) + " ranks, " + schedule + ", " +
               std::to_string(stages_per_worker) + " stage(s) per rank, " +
               std::to_string(replicas) + " replica(s), checkpoint " + checkpoint + ", " +
               std::to_string(chunks) + " chunks" + (skips ? ", skips" : ""));
  const auto [input, target] = testing::distributed_batch();
  const int64_t S = ranks / replicas * stages_per_worker;
  std::vector<int64_t> balance = testing::distributed_balance(S);
  auto plain = testing::distributed_model(balance, -1, "", false, skips);
  const at::Tensor expected_loss = torch::mse_loss(plain->forward(input), target);
  expected_loss.backward();

  const testing::Launch launch = testing::launch_workers(
      ranks, "--schedule " + schedule + " --stages-per-worker " +
                 std::to_string(stages_per_worker) + " --chunks " + std::to_string(chunks) +
                 " --data-parallel " + std::to_string(replicas) + " --checkpoint " + checkpoint +
                 (skips ? " --skips 1 " : " ") + flags);
  ASSERT_EQ(launch.exit_code, 0) << launch.output;
  for (int r = 0; r < ranks; ++r) {
    at::Tensor loss;
    torch::load(loss, launch.dir + "/loss_rank" + std::to_string(r) + ".pt");
    EXPECT_TRUE(close(loss, expected_loss))
        << "rank " << r << ": " << loss << " vs " << expected_loss;
  }
  int64_t layer = 0;
  for (int64_t s = 0; s < S; ++s) {
    std::vector<at::Tensor> expected;
    for (int64_t k = 0; k < balance[s]; ++k, ++layer) {
      for (const auto& p : plain->ptr(layer)->parameters()) expected.push_back(p.grad());
    }
    for (int64_t d = 0; d < replicas; ++d) {
      std::vector<at::Tensor> grads;
      torch::load(grads, launch.dir + "/grads_stage" + std::to_string(s) + "_replica" +
                             std::to_string(d) + ".pt");
      ASSERT_EQ(grads.size(), expected.size()) << "stage " << s;
      for (size_t k = 0; k < grads.size(); ++k) {
        EXPECT_TRUE(close(grads[k], expected[k]))
            << "stage " << s << ", replica " << d << ", parameter " << k;
      }
    }
  }
}

TEST(DistributedPipelineTest, TwoRanksEverySchedule) {
  expect_equivalent(2, "gpipe", 1);
  expect_equivalent(2, "1f1b", 1);
  expect_equivalent(2, "interleaved_1f1b", 2);
  expect_equivalent(2, "zb1p", 1);
  expect_equivalent(2, "interleaved_zb1p", 2);
  expect_equivalent(2, "looped_bfs", 2);
}

TEST(DistributedPipelineTest, FourRanksEverySchedule) {
  expect_equivalent(4, "gpipe", 1);
  expect_equivalent(4, "1f1b", 1);
  expect_equivalent(4, "interleaved_1f1b", 2);
  expect_equivalent(4, "zb1p", 1);
  expect_equivalent(4, "interleaved_zb1p", 2);
  expect_equivalent(4, "looped_bfs", 2);
}

// ZBV on 2 and 4 ranks for 1..8 micro-batches: the V's turn at the last rank passes tensors
// within the process, and rank 0 computes the loss.
TEST(DistributedPipelineTest, ZbvEveryMicroBatchCount) {
  for (const int ranks : {2, 4}) {
    for (int64_t chunks = 1; chunks <= 8; ++chunks) {
      expect_equivalent(ranks, "zbv", 2, 1, "never", chunks);
    }
  }
}

// V-Min and V-Half on 2 and 4 ranks, from one micro-batch to more than their bound holds.
TEST(DistributedPipelineTest, VMinAndVHalfOnTwoAndFourRanks) {
  for (const std::string schedule : {"v_min", "v_half"}) {
    for (const int ranks : {2, 4}) {
      for (const int64_t chunks : {1, 3, 8}) {
        expect_equivalent(ranks, schedule, 2, 1, "never", chunks);
      }
    }
  }
}

// DualPipeV on 2 and 4 ranks for every micro-batch count it allows up to 8 (from one per stage).
TEST(DistributedPipelineTest, DualPipeVEveryMicroBatchCount) {
  for (const int ranks : {2, 4}) {
    for (int64_t chunks = 2 * ranks; chunks <= 8; ++chunks) {
      expect_equivalent(ranks, "dualpipev", 2, 1, "never", chunks);
    }
  }
}

// Schedules from files on ranks: ZBV as gpipe writes it, and 1F1B as torch.distributed.pipelining
// writes its CSV, sends and receives included.
TEST(DistributedPipelineTest, ScheduleFromAFile) {
  const std::string dir = ::testing::TempDir();
  const std::string zbv = dir + "gpipe_distributed_zbv.txt";
  std::ofstream(zbv) << schedule::write_schedule(schedule::zbv_schedule(2, 4));
  expect_equivalent(2, "1f1b", 2, 1, "never", 4, "--schedule-file " + zbv);
  const std::string csv = dir + "gpipe_distributed_1f1b.csv";
  std::ofstream(csv) << "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                        "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n";
  expect_equivalent(2, "1f1b", 1, 1, "never", 2, "--schedule-file " + csv);
}

// Skips across stages go straight from the stashing rank to the popping one (the skip lane of
// c10d_transport.h), and their gradients back: on 2 and 4 ranks under every schedule, the V's
// included, and checkpointed.
TEST(DistributedPipelineTest, SkipsAcrossStagesEverySchedule) {
  for (const int ranks : {2, 4}) {
    for (const auto& [schedule, per_rank] :
         std::vector<std::pair<std::string, int64_t>>{{"gpipe", 1},
                                                      {"1f1b", 1},
                                                      {"zb1p", 1},
                                                      {"interleaved_1f1b", 2},
                                                      {"interleaved_zb1p", 2},
                                                      {"looped_bfs", 2},
                                                      {"zbv", 2}}) {
      expect_equivalent(ranks, schedule, per_rank, 1, "never", 4, "", /*skips=*/true);
    }
  }
  expect_equivalent(2, "1f1b", 1, 1, "always", 4, "", /*skips=*/true);
  expect_equivalent(4, "zbv", 2, /*replicas=*/2, "never", 4, "", /*skips=*/true);
  expect_equivalent(2, "dualpipev", 2, 1, "never", 4, "", /*skips=*/true);
  expect_equivalent(4, "dualpipev", 2, 1, "never", 8, "", /*skips=*/true);
}

// The receive window changes when messages move, never what they carry: with one receive
// posted at a time, two, or every one the schedule's stages hold at once, the losses and
// gradients of two steps are bitwise the same, skips across stages included, and they are the
// plain model's.
TEST(DistributedPipelineTest, ReceiveWindowKeepsEveryBitOfTheGradients) {
  for (const auto& [ranks, schedule, per_rank] : std::vector<std::tuple<int, std::string, int64_t>>{
           {2, "gpipe", 1}, {4, "1f1b", 1}, {2, "zbv", 2}, {4, "interleaved_1f1b", 2}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks, " + schedule);
    const int64_t S = ranks * per_rank;
    std::map<int64_t, std::vector<std::vector<at::Tensor>>> grads;  // per window, per stage
    std::map<int64_t, std::vector<at::Tensor>> losses;              // per window, per rank
    for (const int64_t window : {1, 2, 0}) {
      const std::string flags = "--schedule " + schedule + " --stages-per-worker " +
                                std::to_string(per_rank) + " --chunks 8 --skips 1 --steps 2" +
                                " --receive-window " + std::to_string(window);
      const testing::Launch launch = testing::launch_workers(ranks, flags);
      ASSERT_EQ(launch.exit_code, 0) << launch.output;
      for (int r = 0; r < ranks; ++r) {
        at::Tensor loss;
        torch::load(loss, launch.dir + "/loss_rank" + std::to_string(r) + ".pt");
        losses[window].push_back(loss);
      }
      for (int64_t s = 0; s < S; ++s) {
        std::vector<at::Tensor> stage;
        torch::load(stage, launch.dir + "/grads_stage" + std::to_string(s) + "_replica0.pt");
        grads[window].push_back(stage);
      }
    }
    for (const int64_t window : {2, 0}) {
      for (int r = 0; r < ranks; ++r) {
        EXPECT_TRUE(testing::bitwise_equal(losses[window][r], losses[1][r]))
            << "window " << window << ", rank " << r;
      }
      for (int64_t s = 0; s < S; ++s) {
        ASSERT_EQ(grads[window][s].size(), grads[1][s].size());
        for (size_t k = 0; k < grads[1][s].size(); ++k) {
          EXPECT_TRUE(testing::bitwise_equal(grads[window][s][k], grads[1][s][k]))
              << "window " << window << ", stage " << s << ", parameter " << k;
        }
      }
    }
  }
  expect_equivalent(2, "gpipe", 1, 1, "never", 8, "--receive-window 1", /*skips=*/true);
  expect_equivalent(2, "gpipe", 1, 1, "never", 8, "--receive-window 3", /*skips=*/true);
}

// Steps without zeroing the gradients add them up, with replicas and ties: two steps leave twice
// one step's gradients, under either loss reduction. Replicas and ties must reduce only the
// step's own gradients (summed over replicas, the ones accumulated before would count D times),
// while the others accumulate in place.
TEST(DistributedPipelineTest, StepsAccumulateGradientsWithReplicasAndTies) {
  for (const auto& [ranks, replicas, flags] : std::vector<std::tuple<int, int64_t, std::string>>{
           {4, 2, "--loss-reduction mean"},
           {4, 2, "--loss-reduction sum"},
           {2, 1, "--tied 1"},
           {4, 2, "--tied 1 --loss-reduction sum"}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks, " + std::to_string(replicas) + " replicas, " +
                 flags);
    std::map<int64_t, std::vector<std::vector<at::Tensor>>> grads;  // per steps
    for (const int64_t steps : {1, 2}) {
      const testing::Launch launch = testing::launch_workers(
          ranks, "--schedule 1f1b --chunks 4 --data-parallel " + std::to_string(replicas) + " " +
                     flags + " --steps " + std::to_string(steps));
      ASSERT_EQ(launch.exit_code, 0) << launch.output;
      for (int64_t s = 0; s < ranks / replicas; ++s) {
        for (int64_t d = 0; d < replicas; ++d) {
          std::vector<at::Tensor> stage;
          torch::load(stage, launch.dir + "/grads_stage" + std::to_string(s) + "_replica" +
                                 std::to_string(d) + ".pt");
          grads[steps].push_back(stage);
        }
      }
    }
    ASSERT_EQ(grads[1].size(), grads[2].size());
    for (size_t k = 0; k < grads[1].size(); ++k) {
      ASSERT_EQ(grads[1][k].size(), grads[2][k].size());
      for (size_t p = 0; p < grads[1][k].size(); ++p) {
        EXPECT_TRUE(close(grads[2][k][p], 2 * grads[1][k][p]))
            << "stage " << k / replicas << ", replica " << k % replicas << ", parameter " << p;
      }
    }
  }
}

TEST(DistributedPipelineTest, Checkpointing) {
  expect_equivalent(2, "1f1b", 1, 1, "always");
  expect_equivalent(2, "gpipe", 1, 1, "except_last");
}

TEST(DistributedPipelineTest, PipelineTimesDataParallel) {
  // 2 replicas of a 2-rank pipeline, each on half the batch: the gradients, averaged over the
  // replicas, and the loss are those of the plain model on the whole batch.
  expect_equivalent(4, "1f1b", 1, /*replicas=*/2);
  expect_equivalent(4, "gpipe", 1, /*replicas=*/2);
  expect_equivalent(4, "zbv", 2, /*replicas=*/2);
}

// Each rank's tracer records its own actions, as its worker row and its process: a forward and a
// backward of each of the 4 micro-batches on its stage. The ranks' clocks are aligned: on one
// machine, where they share one steady clock, their timelines start at the same moment to within
// the uncertainty each states; and in the merged trace (gpipe trace merge) no stage starts a
// micro-batch before the stage that feeds it has finished it.
TEST(DistributedPipelineTest, EachRankTracesItsActionsOnOneTimeline) {
  const testing::Launch launch =
      testing::launch_workers(2, "--schedule 1f1b --chunks 4 --steps 3 --trace 1");
  ASSERT_EQ(launch.exit_code, 0) << launch.output;
  std::vector<double> origin_us(2), uncertainty_us(2);
  int64_t tasks = 0;
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(launch.dir + "/trace_rank" + std::to_string(r) + ".json");
    ASSERT_TRUE(in.good()) << "rank " << r;
    const auto trace = nlohmann::json::parse(in);
    std::map<std::string, int> count;
    for (const auto& event : trace["traceEvents"]) {
      if (event["ph"] != "X") continue;
      EXPECT_EQ(event["pid"], r);
      EXPECT_EQ(event["tid"], r);
      EXPECT_EQ(event["args"]["stage"], r);
      ++count[event["name"].get<std::string>()];
      ++tasks;
    }
    EXPECT_EQ(count["forward"], 3 * 4) << "rank " << r;
    EXPECT_EQ(count["backward"], 3 * 4) << "rank " << r;
    EXPECT_EQ(count[r == 0 ? "send_activation" : "recv_activation"], 3 * 4) << "rank " << r;
    std::ifstream clock(launch.dir + "/clock_rank" + std::to_string(r) + ".txt");
    ASSERT_TRUE(clock >> origin_us[r] >> uncertainty_us[r]) << "rank " << r;
  }
  // Rank 0's clock is the timeline's; the other's uncertainty is a round trip through the store,
  // whose length depends on the machine's load (0.1 ms idle, 100 ms seen under CI's).
  EXPECT_EQ(uncertainty_us[0], 0);
  EXPECT_GT(uncertainty_us[1], 0);
  // 1 µs more for reading the two clocks one after the other.
  EXPECT_LE(std::abs(origin_us[1] - origin_us[0]), uncertainty_us[1] + 1)
      << "origins " << origin_us[0] << " and " << origin_us[1] << " us";

  std::ostringstream said;
  cli::trace_merge(cli::parse_trace_merge_config({"-o", launch.dir + "/merged.json",
                                                  launch.dir + "/trace_rank0.json",
                                                  launch.dir + "/trace_rank1.json"}),
                   said);
  EXPECT_EQ(said.str(), launch.dir + "/merged.json: " + std::to_string(tasks) +
                            " tasks of 2 ranks from 2 files\n");
  // (kind, stage, step, micro-batch) -> (begin, end)
  std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, std::pair<double, double>> spans;
  for (const auto& e : cli::read_chrome_trace(launch.dir + "/merged.json")) {
    EXPECT_EQ(e.rank, e.stage);
    spans[{e.name, e.stage, e.step, e.microbatch}] = {e.begin_us, e.end_us};
  }
  const double slack = uncertainty_us[1];
  for (int64_t step = 0; step < 3; ++step) {
    for (int64_t m = 0; m < 4; ++m) {
      SCOPED_TRACE("step " + std::to_string(step) + ", micro-batch " + std::to_string(m));
      const auto forward = [&](int64_t s) { return spans.at({"forward", s, step, m}); };
      const auto backward = [&](int64_t s) { return spans.at({"backward", s, step, m}); };
      EXPECT_GE(forward(1).first, forward(0).second - slack);
      EXPECT_GE(backward(0).first, backward(1).second - slack);
    }
  }
}

TEST(DistributedPipelineTest, StagesMustMatchWorldSize) {
  // Fails before any rendezvous: no other rank is needed to see the mistake.
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1", 1);
  std::vector<int64_t> balance{6, 5, 5};
  auto model = testing::distributed_model(balance);
  const auto loss = [](const Batch& y, const Batch& t) {
    return torch::mse_loss(y.tensor(), t.tensor());
  };
  GPIPE_EXPECT_THROW_WITH(PipelineStage(model, {6, 5, 5}, loss, PipelineStageOptions(4)),
                          c10::ValueError,
                          "balance names 3 stages, but WORLD_SIZE = 2 ranks with 1 stage(s) each "
                          "run 2");
  GPIPE_EXPECT_THROW_WITH(
      PipelineStage(model, {8, 8}, loss, PipelineStageOptions(4).data_parallel(2)), c10::ValueError,
      "balance names 2 stages, but WORLD_SIZE = 2 ranks in 2 replicas with 1 "
      "stage(s) each run 1");
  GPIPE_EXPECT_THROW_WITH(
      PipelineStage(model, {8, 8}, loss, PipelineStageOptions(4).data_parallel(3)), c10::ValueError,
      "data_parallel (3) must be positive and divide WORLD_SIZE = 2");
  GPIPE_EXPECT_THROW_WITH(
      PipelineStage(model, {8, 8}, loss, PipelineStageOptions(4).stages_per_worker(2)),
      c10::ValueError, "runs one stage per rank, but stages_per_worker is 2");
  GPIPE_EXPECT_THROW_WITH(
      PipelineStage(model, {8, 8}, loss, PipelineStageOptions(4).intra_op_threads(-1)),
      c10::ValueError, "intra_op_threads must be non-negative, but got -1");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  GPIPE_EXPECT_THROW_WITH(
      PipelineStage(model, {8, 8}, loss,
                    PipelineStageOptions(4)
                        .schedule(schedule::ScheduleKind::kInterleavedOneFOneB)
                        .stages_per_worker(kMax)),
      c10::ValueError,
      "balance names 2 stages, but WORLD_SIZE = 2 ranks with 9223372036854775807 stage(s) each "
      "run 18446744073709551614");
  GPIPE_EXPECT_THROW_WITH(PipelineStage(model, {kMax, kMax, 2}, loss, PipelineStageOptions(4)),
                          c10::ValueError, "balance names 3 stages");
  GPIPE_EXPECT_THROW_WITH(PipelineStage(model, {kMax, 2}, loss, PipelineStageOptions(4)),
                          c10::ValueError,
                          "module and sum of balance have different length (module: 16, sum of "
                          "balance: 9223372036854775809)");
  unsetenv("WORLD_SIZE");
  GPIPE_EXPECT_THROW_WITH(PipelineStage(model, {8, 8}, loss, PipelineStageOptions(4)),
                          c10::ValueError, "WORLD_SIZE is not set");
  for (const char* name : {"RANK", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(name);
}

}  // namespace
}  // namespace distributed_pipeline_test
}  // namespace distributed
}  // namespace gpipe

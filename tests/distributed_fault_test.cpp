// Tests of failures across processes: a rank that throws, is killed or hangs makes every other
// rank exit non-zero with a message naming it, within the timeout; a shape mismatch between
// stages is a clear error on both sides.
#include "test_util.h"

#include "distributed_launch.h"

#include <string>
#include <utility>
#include <vector>

namespace gpipe {
namespace distributed {
namespace {

using ::testing::HasSubstr;

std::string error_of(const testing::Launch& launch, int rank) {
  return testing::read_text(launch.dir + "/error_rank" + std::to_string(rank));
}

TEST(DistributedFaultTest, RankThatThrowsIsNamedOnEveryRank) {
  for (const int ranks : {2, 4}) {
    const int failing = ranks - 1;
    const auto launch = testing::launch_workers(
        ranks, "--schedule 1f1b --fail-rank " + std::to_string(failing) + " --fail-mode throw");
    EXPECT_NE(launch.exit_code, 0) << launch.output;
    EXPECT_THAT(launch.output, HasSubstr("rank " + std::to_string(failing) + " exited"));
    for (int r = 0; r < ranks; ++r) {
      EXPECT_THAT(error_of(launch, r), HasSubstr("injected failure")) << "rank " << r;
      if (r != failing) {
        EXPECT_THAT(error_of(launch, r), HasSubstr("rank " + std::to_string(failing) + " failed: "))
            << "rank " << r;
      }
    }
  }
}

TEST(DistributedFaultTest, KilledRankIsNamedWithinTimeout) {
  // Rank 0 also serves the store: the others then learn of it from the store's loss.
  for (const auto& [ranks, killed] : std::vector<std::pair<int, int>>{{2, 1}, {4, 2}, {4, 0}}) {
    // A generous timeout: a killed rank's connections close, so detection needs none of it.
    const auto launch =
        testing::launch_workers(ranks, "--schedule 1f1b --timeout-ms 20000 --fail-rank " +
                                           std::to_string(killed) + " --fail-mode kill");
    EXPECT_NE(launch.exit_code, 0) << launch.output;
    EXPECT_THAT(launch.output, HasSubstr("rank " + std::to_string(killed) + " was killed"));
    EXPECT_LT(launch.seconds, 20.0) << launch.output;
    for (int r = 0; r < ranks; ++r) {
      if (r == killed) continue;
      EXPECT_THAT(error_of(launch, r), HasSubstr("rank " + std::to_string(killed) + " failed"))
          << "rank " << r << "\n"
          << launch.output;
    }
  }
}

TEST(DistributedFaultTest, HungRankTimesOut) {
  // Rank 1 sleeps in its forward; rank 0 gives up after the 2 s timeout and names it.
  const auto launch = testing::launch_workers(
      2, "--schedule gpipe --timeout-ms 2000 --fail-rank 1 --fail-mode hang", /*grace=*/1);
  EXPECT_NE(launch.exit_code, 0) << launch.output;
  EXPECT_THAT(error_of(launch, 0), HasSubstr("rank 1 failed: no answer within 2000 ms"))
      << launch.output;
  EXPECT_LT(launch.seconds, 15.0) << launch.output;
}

TEST(DistributedFaultTest, ShapeMismatchIsClearOnBothSides) {
  // Stage 0's second micro-batch comes out one column wider than its first.
  const auto launch =
      testing::launch_workers(2, "--schedule 1f1b --fail-rank 0 --fail-mode mismatch");
  EXPECT_NE(launch.exit_code, 0) << launch.output;
  const std::string expected =
      "stage 0 sends to stage 1 for micro-batch 1 an activation (Double[3, 5]), but the edge "
      "agreed on (Double[*, 4]) with its first message";
  EXPECT_THAT(error_of(launch, 0), HasSubstr(expected)) << launch.output;
  EXPECT_THAT(error_of(launch, 1), HasSubstr("rank 0 failed: " + expected)) << launch.output;
}

}  // namespace
}  // namespace distributed
}  // namespace gpipe

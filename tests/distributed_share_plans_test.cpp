// distributed::share_plans (gpipe/distributed/share_plans.h): rank 0 plans, every rank gets what
// training needs of its plans, and a rank 0 that cannot plan is named on the others at once.
#include "test_util.h"

#include "gpipe/distributed/share_plans.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <stdexcept>
#include <vector>

namespace gpipe {
namespace distributed_share_plans_test {
namespace {

using schedule::ScheduleKind;

// Two ranks of one store, without a process group: sharing plans needs only the store.
std::vector<distributed::ProcessGroup> two_ranks() {
  const auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(std::chrono::seconds(20));
  std::vector<distributed::ProcessGroup> ranks(2);
  for (int64_t r = 0; r < 2; ++r) {
    ranks[r].environment.rank = r;
    ranks[r].environment.world_size = 2;
    ranks[r].store = store;
  }
  return ranks;
}

std::vector<Plan> two_plans() {
  Plan zbv;
  zbv.schedule = ScheduleKind::kZeroBubbleV;
  zbv.stages_per_worker = 2;
  zbv.balance = {2, 1, 1, 2};
  zbv.microbatches = 8;
  zbv.step_seconds = 0.25;
  Plan one_f_one_b;
  one_f_one_b.schedule = ScheduleKind::kOneFOneB;
  one_f_one_b.balance = {3, 3};
  one_f_one_b.microbatches = 4;
  one_f_one_b.checkpoint = CheckpointMode::kExceptLast;
  return {zbv, one_f_one_b};
}

TEST(DistributedSharePlansTest, EveryRankTrainsRankZerosPlans) {
  auto ranks = two_ranks();
  std::atomic<int> planned{0};
  const auto plan_here = [&] {
    ++planned;
    return two_plans();
  };
  // Rank 1 asks first: it waits for rank 0's plans.
  auto other =
      std::async(std::launch::async, [&] { return distributed::share_plans(ranks[1], plan_here); });
  const std::vector<Plan> on_zero = distributed::share_plans(ranks[0], plan_here);
  const std::vector<Plan> on_one = other.get();
  EXPECT_EQ(planned.load(), 1) << "only rank 0 plans";
  ASSERT_EQ(on_zero.size(), 2u);
  EXPECT_DOUBLE_EQ(on_zero[0].step_seconds, 0.25);  // rank 0 keeps its predictions
  ASSERT_EQ(on_one.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(on_one[k].schedule, on_zero[k].schedule);
    EXPECT_EQ(on_one[k].stages_per_worker, on_zero[k].stages_per_worker);
    EXPECT_EQ(on_one[k].microbatches, on_zero[k].microbatches);
    EXPECT_EQ(on_one[k].checkpoint, on_zero[k].checkpoint);
    EXPECT_EQ(on_one[k].balance, on_zero[k].balance);
  }
  // A second call is a second exchange, not the first one's plans again.
  auto again =
      std::async(std::launch::async, [&] { return distributed::share_plans(ranks[1], plan_here); });
  const auto single = [] { return std::vector<Plan>{two_plans()[1]}; };
  EXPECT_EQ(distributed::share_plans(ranks[0], single).size(), 1u);
  EXPECT_EQ(again.get().size(), 1u);
}

TEST(DistributedSharePlansTest, ARankZeroThatCannotPlanIsNamedOnTheOthers) {
  auto ranks = two_ranks();
  const auto fails = []() -> std::vector<Plan> {
    TORCH_CHECK_VALUE(false, "no plan fits: the cap is 1.0 MiB");
  };
  auto other =
      std::async(std::launch::async, [&] { return distributed::share_plans(ranks[1], fails); });
  GPIPE_EXPECT_THROW_WITH(distributed::share_plans(ranks[0], fails), c10::ValueError,
                          "no plan fits: the cap is 1.0 MiB");
  const auto begun = std::chrono::steady_clock::now();
  GPIPE_EXPECT_THROW_WITH(other.get(), c10::Error,
                          "rank 0 could not plan: no plan fits: the cap is 1.0 MiB");
  EXPECT_LT(std::chrono::steady_clock::now() - begun, std::chrono::seconds(10))
      << "told at once, not at the store's timeout";
}

}  // namespace
}  // namespace distributed_share_plans_test
}  // namespace gpipe

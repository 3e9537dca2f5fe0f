// Skip trackers: the thread's default one, and the one through portals. Ports
// tests/skip/test_tracker.py.
#include "test_util.h"

#include <gpipe/checkpoint.h>
#include <gpipe/skip/tracker.h>

#include "detail/checkpointing.h"

#include <thread>

namespace gpipe {
namespace skip {
namespace skip_tracker_test {
namespace {

const SkipKey kCopy{Namespace::none(), "copy"};
const SkipKey kNotCopy{Namespace::none(), "not_copy"};

std::shared_ptr<const SkipLayout> layout(std::vector<SkipRoute> routes) {
  return std::make_shared<const SkipLayout>(2, std::move(routes));
}

// A tracker where `kCopy` goes from partition 0 to 1 and `kNotCopy` stays in partition 0.
std::shared_ptr<SkipTrackerThroughPortals> tracker() {
  return std::make_shared<SkipTrackerThroughPortals>(
      layout({{kCopy, 0, 1, "0", "0"}, {kNotCopy, 0, 0, "0", "1"}}));
}

TEST(SkipTrackerTest, DefaultSkipTrackerIsPlainAndPerThread) {
  std::shared_ptr<SkipTracker> other_thread;
  std::thread thread([&] { other_thread = current_skip_tracker(); });
  thread.join();
  ASSERT_NE(other_thread, nullptr);
  EXPECT_EQ(dynamic_cast<SkipTrackerThroughPortals*>(other_thread.get()), nullptr);
  EXPECT_NE(other_thread, current_skip_tracker());
  EXPECT_EQ(current_skip_tracker(), current_skip_tracker());
}

TEST(SkipTrackerTest, UseSkipTrackerRestoresThePreviousOne) {
  auto outer = current_skip_tracker();
  auto inner = tracker();
  {
    UseSkipTracker use(inner);
    EXPECT_EQ(current_skip_tracker(), inner);
  }
  EXPECT_EQ(current_skip_tracker(), outer);
}

TEST(SkipTrackerTest, SaveLoad) {
  SkipTracker plain;
  auto x = torch::rand({2});
  plain.save(kCopy, x);
  EXPECT_EQ(plain.tensors().size(), 1u);
  EXPECT_TRUE(plain.load(kCopy).is_same(x));
  EXPECT_TRUE(plain.tensors().empty());
  GPIPE_EXPECT_THROW_WITH(plain.load(kCopy), c10::Error, "'copy' has not been stashed");
}

TEST(SkipTrackerTest, ReusePortal) {
  auto skip_tracker = tracker();
  Batch batch(torch::tensor({1.0}));
  skip_tracker->open(batch, 0);
  skip_tracker->save(kCopy, torch::tensor({2.0}));
  skip_tracker->save(kNotCopy, torch::tensor({2.0}));
  skip_tracker->load(kNotCopy);
  skip_tracker->close(batch, 0);
  auto portal = skip_tracker->portals().at(kCopy);

  skip_tracker->open(batch, 0);
  skip_tracker->save(kCopy, torch::tensor({2.0}));
  skip_tracker->save(kNotCopy, torch::tensor({2.0}));
  skip_tracker->load(kNotCopy);
  skip_tracker->close(batch, 0);
  EXPECT_EQ(skip_tracker->portals().at(kCopy), portal);
}

TEST(SkipTrackerTest, NoCopyNoPortal) {
  auto skip_tracker = tracker();
  Batch batch(torch::tensor({1.0}));
  skip_tracker->open(batch, 0);
  skip_tracker->save(kCopy, torch::tensor({2.0}));
  skip_tracker->save(kNotCopy, torch::tensor({2.0}));
  EXPECT_EQ(skip_tracker->tensors().count(kNotCopy), 1u);
  EXPECT_EQ(skip_tracker->tensors().count(kCopy), 0u);
  skip_tracker->load(kNotCopy);
  skip_tracker->close(batch, 0);
  EXPECT_EQ(skip_tracker->portals().count(kCopy), 1u);
  EXPECT_EQ(skip_tracker->portals().count(kNotCopy), 0u);
}

// Partition 0 stashes kCopy, partition 1 pops it; only kCopy is routed.
std::shared_ptr<SkipTrackerThroughPortals> copy_only_tracker() {
  return std::make_shared<SkipTrackerThroughPortals>(layout({{kCopy, 0, 1, "0", "0"}}));
}

TEST(SkipTrackerTest, TensorLifeWithoutCheckpointing) {
  auto skip_tracker = copy_only_tracker();
  Batch batch(torch::tensor({1.0}));
  auto tensor = torch::tensor({2.0});

  skip_tracker->open(batch, 0);
  skip_tracker->save(kCopy, tensor);
  skip_tracker->close(batch, 0);
  EXPECT_EQ(skip_tracker->portals().at(kCopy)->tensor_life(), 1);

  skip_tracker->open(batch, 1);
  EXPECT_TRUE(skip_tracker->load(kCopy).equal(tensor));
  skip_tracker->close(batch, 1);
  EXPECT_EQ(skip_tracker->portals().at(kCopy)->tensor_life(), 0);
  EXPECT_FALSE(skip_tracker->portals().at(kCopy)->tensor().defined());  // freed once popped
}

TEST(SkipTrackerTest, TensorLifeWithCheckpointing) {
  auto skip_tracker = copy_only_tracker();
  Batch batch(torch::tensor({1.0}));
  auto tensor = torch::tensor({2.0});
  const auto& portals = skip_tracker->portals();

  {
    gpipe::detail::EnableCheckpointing checkpointing;
    skip_tracker->open(batch, 0);
    skip_tracker->save(kCopy, tensor);
    skip_tracker->close(batch, 0);
  }
  EXPECT_EQ(portals.at(kCopy)->tensor_life(), 2);

  {
    gpipe::detail::EnableCheckpointing checkpointing;
    skip_tracker->open(batch, 1);
    skip_tracker->load(kCopy);
    skip_tracker->close(batch, 1);
  }
  EXPECT_EQ(portals.at(kCopy)->tensor_life(), 1);

  {
    gpipe::detail::EnableRecomputing recomputing;
    skip_tracker->open(batch, 1);
    skip_tracker->load(kCopy);
    skip_tracker->close(batch, 1);
  }
  EXPECT_EQ(portals.at(kCopy)->tensor_life(), 0);

  {
    gpipe::detail::EnableRecomputing recomputing;
    skip_tracker->open(batch, 0);
    skip_tracker->save(kCopy, tensor);
    skip_tracker->close(batch, 0);
  }
  EXPECT_EQ(portals.at(kCopy)->tensor_life(), 0);
  EXPECT_FALSE(portals.at(kCopy)->tensor().defined());
}

TEST(SkipTrackerTest, CloseChecksEveryDeclaredSkip) {
  auto skip_tracker = copy_only_tracker();
  Batch batch(torch::tensor({1.0}));
  skip_tracker->open(batch, 0);
  GPIPE_EXPECT_THROW_WITH(skip_tracker->close(batch, 0), c10::Error,
                          "'copy' must be stashed but have not (layer '0' of partition 0 "
                          "declares it stashable)");

  skip_tracker->open(batch, 0);
  skip_tracker->save(kCopy, torch::tensor({2.0}));
  skip_tracker->close(batch, 0);
  skip_tracker->open(batch, 1);
  GPIPE_EXPECT_THROW_WITH(skip_tracker->close(batch, 1), c10::Error,
                          "'copy' must be popped but have not (layer '0' of partition 1 "
                          "declares it poppable)");
}

TEST(SkipTrackerTest, OpenRefusesWhatWasNotStashed) {
  auto skip_tracker = copy_only_tracker();
  Batch batch(torch::tensor({1.0}));
  GPIPE_EXPECT_THROW_WITH(skip_tracker->open(batch, 1), c10::Error, "'copy' has not been stashed");
}

}  // namespace
}  // namespace skip_tracker_test
}  // namespace skip
}  // namespace gpipe

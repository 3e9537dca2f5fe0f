// stash() and pop() in skippable layers, and their misuse. Ports tests/skip/test_stash_pop.py.
#include "test_util.h"

#include <gpipe/pipe.h>
#include <gpipe/skip/skippable.h>
#include <gpipe/skip/tracker.h>

namespace gpipe {
namespace skip {
namespace skip_stash_pop_test {
namespace {

using torch::nn::Sequential;

// Stashes its input under "foo" (or not, or something undeclared) and returns input * 2.
struct StashImpl : torch::nn::Module, Skippable {
  enum class Does { kStash, kNothing, kStashUndeclared, kStashUndefined };
  explicit StashImpl(Does does = Does::kStash, std::vector<std::string> declared = {"foo"})
      : Skippable(std::move(declared), {}), does_(does) {}
  torch::Tensor forward(torch::Tensor input) {
    switch (does_) {
      case Does::kStash:
        stash("foo", input);
        break;
      case Does::kStashUndeclared:
        stash("bar", input);
        break;
      case Does::kStashUndefined:
        stash("foo", torch::Tensor());
        break;
      case Does::kNothing:
        break;
    }
    return input * 2;
  }
  Does does_;
};
TORCH_MODULE(Stash);

// Returns what was stashed under "foo" (or input * 3 without popping, or pops undeclared).
struct PopImpl : torch::nn::Module, Skippable {
  enum class Does { kPop, kNothing, kPopUndeclared };
  explicit PopImpl(Does does = Does::kPop, std::vector<std::string> declared = {"foo"})
      : Skippable({}, std::move(declared)), does_(does) {}
  torch::Tensor forward(torch::Tensor input) {
    switch (does_) {
      case Does::kPop:
        return pop("foo");
      case Does::kPopUndeclared:
        return pop("bar");
      case Does::kNothing:
        break;
    }
    return input * 3;
  }
  Does does_;
};
TORCH_MODULE(Pop);

using S = StashImpl::Does;
using P = PopImpl::Does;

// Each test runs with a fresh plain tracker, as the reference's fixture does.
class StashPopTest : public ::testing::Test {
 protected:
  std::shared_ptr<SkipTracker> tracker_ = std::make_shared<SkipTracker>();
  UseSkipTracker use_{tracker_};
};

TEST_F(StashPopTest, Stash) {
  Stash l1;
  EXPECT_TRUE(tracker_->tensors().empty());
  l1(torch::tensor(42));
  EXPECT_EQ(tracker_->tensors().size(), 1u);
}

TEST_F(StashPopTest, Pop) {
  Stash l1;
  Pop l2;
  EXPECT_EQ(l2(l1(torch::tensor(42))).item<int64_t>(), 42);
  EXPECT_TRUE(tracker_->tensors().empty());
}

TEST_F(StashPopTest, StashNotDeclared) {
  Stash l1(S::kStashUndeclared);
  GPIPE_EXPECT_THROW_WITH(l1(torch::tensor(42)), c10::Error,
                          "'bar' has not been declared as stashable");
}

TEST_F(StashPopTest, PopNotDeclared) {
  Stash l1;
  Pop l2(P::kPopUndeclared);
  auto latent = l1(torch::tensor(42));
  GPIPE_EXPECT_THROW_WITH(l2(latent), c10::Error, "'bar' has not been declared as poppable");
}

TEST_F(StashPopTest, PopNotStashed) {
  Pop l1;
  GPIPE_EXPECT_THROW_WITH(l1(torch::tensor(42)), c10::Error, "'foo' has not been stashed");
}

TEST_F(StashPopTest, StashNone) {
  Stash l1(S::kStashUndefined);
  Pop l2;
  EXPECT_FALSE(l2(l1(torch::tensor(42))).defined());
}

// GPipe runs each partition between its tracker's open() and close(), which check that the
// layers did what they declared.
TEST(StashPopGPipeTest, DeclareButNotStash) {
  // Partition 0 closes before partition 1 pops: its close() finds the missing stash.
  GPipe split(Sequential(Stash(S::kNothing), Pop(P::kPop)), GPipeOptions({1, 1}));
  GPIPE_EXPECT_THROW_WITH(split->forward(torch::rand({4, 2})), c10::Error,
                          "'foo' must be stashed but have not (layer '0' of partition 0 "
                          "declares it stashable)");
  // Within one partition the pop comes first and finds nothing.
  GPipe whole(Sequential(Stash(S::kNothing), Pop(P::kPop)), GPipeOptions({2}));
  GPIPE_EXPECT_THROW_WITH(whole->forward(torch::rand({4, 2})), c10::Error,
                          "'foo' has not been stashed");
}

TEST(StashPopGPipeTest, DeclareButNotPop) {
  for (const auto& balance : {std::vector<int64_t>{2}, std::vector<int64_t>{1, 1}}) {
    GPipe model(Sequential(Stash(S::kStash), Pop(P::kNothing)), GPipeOptions(balance));
    const std::string partition = balance.size() == 1 ? "0" : "1";
    GPIPE_EXPECT_THROW_WITH(model->forward(torch::rand({4, 2})), c10::Error,
                            "'foo' must be popped but have not (layer '1' of partition " +
                                partition + " declares it poppable)");
  }
}

TEST(StashPopGPipeTest, ModuleWorksAfterAMisuse) {
  auto stash = std::make_shared<StashImpl>(S::kNothing);
  GPipe model(Sequential(Stash(stash), Pop()), GPipeOptions({1, 1}).chunks(2));
  auto input = torch::rand({4, 2});
  EXPECT_THROW(model->forward(input), c10::Error);
  stash->does_ = S::kStash;
  EXPECT_TRUE(torch::equal(model->forward(input), input));
}

}  // namespace
}  // namespace skip_stash_pop_test
}  // namespace skip
}  // namespace gpipe

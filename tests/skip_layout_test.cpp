// inspect_skip_layout and the copy policy. Ports tests/skip/test_inspect_skip_layout.py.
#include "test_util.h"

#include <gpipe/skip/layout.h>
#include <gpipe/skip/skippable.h>

namespace gpipe {
namespace skip {
namespace skip_layout_test {
namespace {

using torch::nn::Sequential;

struct StashImpl : torch::nn::Module, Skippable {
  explicit StashImpl(const std::string& name) : Skippable({name}, {}), name_(name) {}
  torch::Tensor forward(torch::Tensor input) {
    stash(name_, input);
    return input;
  }
  std::string name_;
};
TORCH_MODULE(Stash);

struct PopImpl : torch::nn::Module, Skippable {
  explicit PopImpl(const std::string& name) : Skippable({}, {name}), name_(name) {}
  torch::Tensor forward(torch::Tensor input) { return input + pop(name_); }
  std::string name_;
};
TORCH_MODULE(Pop);

// (source partition, namespace, name) of each route that partition j copies in.
using Policy = std::vector<std::tuple<size_t, Namespace, std::string>>;

std::vector<Policy> copy_policies(const std::vector<Sequential>& partitions) {
  const SkipLayout layout = inspect_skip_layout(partitions);
  std::vector<Policy> policies;
  for (size_t j = 0; j < partitions.size(); ++j) {
    Policy policy;
    for (const auto& route : layout.copy_policy(j)) {
      policy.emplace_back(route.stash_stage, route.key.first, route.key.second);
    }
    policies.push_back(policy);
  }
  return policies;
}

const Namespace none = Namespace::none();

TEST(InspectSkipLayoutTest, NoSkippables) {
  EXPECT_EQ(copy_policies({Sequential(torch::nn::Identity()), Sequential(torch::nn::Identity())}),
            (std::vector<Policy>{{}, {}}));
  EXPECT_TRUE(inspect_skip_layout({Sequential(torch::nn::Identity())}).empty());
}

TEST(InspectSkipLayoutTest, InnerPartition) {
  std::vector<Sequential> partitions{Sequential(Stash("foo"), Pop("foo")),
                                     Sequential(torch::nn::Identity())};
  EXPECT_EQ(copy_policies(partitions), (std::vector<Policy>{{}, {}}));
  const SkipLayout layout = inspect_skip_layout(partitions);
  EXPECT_FALSE(layout.empty());
  EXPECT_FALSE(layout.requires_copy({none, "foo"}));
}

TEST(InspectSkipLayoutTest, AdjoiningPartitions) {
  std::vector<Sequential> partitions{Sequential(Stash("foo")), Sequential(Pop("foo"))};
  EXPECT_EQ(copy_policies(partitions), (std::vector<Policy>{{}, {{0, none, "foo"}}}));
  EXPECT_TRUE(inspect_skip_layout(partitions).requires_copy({none, "foo"}));
}

TEST(InspectSkipLayoutTest, FarPartitions) {
  EXPECT_EQ(copy_policies({Sequential(Stash("foo")), Sequential(torch::nn::Identity()),
                           Sequential(Pop("foo"))}),
            (std::vector<Policy>{{}, {}, {{0, none, "foo"}}}));
}

TEST(InspectSkipLayoutTest, Pop2FromDifferentPartitions) {
  // The last partition pops 'bar' before 'foo', but the policy is sorted by source partition.
  EXPECT_EQ(copy_policies({Sequential(Stash("foo")), Sequential(Stash("bar")),
                           Sequential(Pop("bar"), Pop("foo"))}),
            (std::vector<Policy>{{}, {}, {{0, none, "foo"}, {1, none, "bar"}}}));
}

TEST(InspectSkipLayoutTest, Namespace) {
  skip::Namespace ns1;
  skip::Namespace ns2;
  EXPECT_EQ(
      copy_policies({Sequential(isolate(Stash("foo"), ns1)), Sequential(isolate(Stash("foo"), ns2)),
                     Sequential(isolate(Pop("foo"), ns2), isolate(Pop("foo"), ns1))}),
      (std::vector<Policy>{{}, {}, {{0, ns1, "foo"}, {1, ns2, "foo"}}}));
}

TEST(InspectSkipLayoutTest, RoutesNameTheirLayers) {
  const SkipLayout layout = inspect_skip_layout({Sequential(torch::nn::Identity(), Stash("foo")),
                                                 Sequential(torch::nn::Identity(), Pop("foo"))});
  ASSERT_EQ(layout.stashed_in(0).size(), 1u);
  EXPECT_EQ(layout.stashed_in(0)[0].stash_layer, "1");
  EXPECT_EQ(layout.stashed_in(0)[0].pop_layer, "1");
  EXPECT_EQ(layout.stashed_in(0)[0].pop_stage, 1u);
  EXPECT_TRUE(layout.stashed_in(1).empty());
  ASSERT_EQ(layout.popped_in(1).size(), 1u);
  GPIPE_EXPECT_THROW_WITH(layout.popped_in(2), c10::IndexError, "partition 2 is out of range");
}

}  // namespace
}  // namespace skip_layout_test
}  // namespace skip
}  // namespace gpipe

// The skip API: namespaces and skippable declarations. Ports tests/skip/test_api.py.
#include "test_util.h"

#include <gpipe/skip/skippable.h>
#include <gpipe/skip/tracker.h>

#include <sstream>

namespace gpipe {
namespace skip {
namespace skip_api_test {
namespace {

struct StashPopImpl : torch::nn::Module, Skippable {
  StashPopImpl() : Skippable(/*stash=*/{"alice", "bob"}, /*pop=*/{"carol"}) {}
  torch::Tensor forward(torch::Tensor input) {
    stash("alice", input);
    stash("bob", input * 2);
    return input + pop("carol");
  }
};
TORCH_MODULE(StashPop);

TEST(SkipApiTest, NamespaceDifference) {
  Namespace ns1;
  Namespace ns2;
  EXPECT_NE(ns1, ns2);
  EXPECT_NE(ns1, Namespace::none());
}

TEST(SkipApiTest, NamespaceCopy) {
  Namespace ns;
  Namespace copy = ns;
  EXPECT_EQ(copy, ns);
  EXPECT_FALSE(copy < ns || ns < copy);
}

TEST(SkipApiTest, NamespacePrints) {
  std::ostringstream none;
  none << Namespace::none();
  EXPECT_EQ(none.str(), "<Namespace none>");
  Namespace ns;
  std::ostringstream out;
  out << ns;
  EXPECT_EQ(out.str(), "<Namespace " + std::to_string(ns.id()) + ">");
}

TEST(SkipApiTest, DeclaredNamesLiveInNoNamespaceUntilIsolated) {
  StashPop layer;
  EXPECT_EQ(layer->stashable_names(), (std::set<std::string>{"alice", "bob"}));
  EXPECT_EQ(layer->poppable_names(), (std::set<std::string>{"carol"}));
  EXPECT_EQ(layer->key("alice"), SkipKey(Namespace::none(), "alice"));

  Namespace ns;
  layer = isolate(layer, ns);
  EXPECT_EQ(layer->key("alice"), SkipKey(ns, "alice"));
  EXPECT_EQ(layer->key("carol"), SkipKey(ns, "carol"));
}

TEST(SkipApiTest, IsolateOnly) {
  Namespace alice_ns;
  Namespace bob_ns;
  StashPop layer = isolate(isolate(StashPop(), alice_ns, {"alice"}), bob_ns, {"bob"});
  EXPECT_EQ(layer->stashable(), (std::vector<SkipKey>{{alice_ns, "alice"}, {bob_ns, "bob"}}));
  EXPECT_EQ(layer->poppable(), (std::vector<SkipKey>{{Namespace::none(), "carol"}}));
}

TEST(SkipApiTest, IsolateRefusesUndeclaredNames) {
  GPIPE_EXPECT_THROW_WITH(isolate(StashPop(), Namespace(), {"dave"}), c10::ValueError,
                          "cannot isolate 'dave': it is neither stashable nor poppable");
}

TEST(SkipApiTest, IsolateRefusesModulesThatAreNotSkippable) {
  GPIPE_EXPECT_THROW_WITH(isolate(torch::nn::ReLU(), Namespace()), c10::TypeError,
                          "it is not a gpipe::skip::Skippable");
}

TEST(SkipApiTest, AsSkippable) {
  StashPop layer;
  torch::nn::ReLU relu;
  EXPECT_NE(as_skippable(*layer), nullptr);
  EXPECT_EQ(as_skippable(*relu), nullptr);
}

TEST(SkipApiTest, CloneKeepsDeclarationsAndNamespaces) {
  struct CloneableImpl : torch::nn::Cloneable<CloneableImpl>, Skippable {
    CloneableImpl() : Skippable({"x"}, {}) {}
    void reset() override {}
    torch::Tensor forward(torch::Tensor input) {
      stash("x", input);
      return input;
    }
  };
  auto layer = std::make_shared<CloneableImpl>();
  Namespace ns;
  layer->isolate(ns);
  auto clone = std::dynamic_pointer_cast<CloneableImpl>(layer->clone());
  ASSERT_NE(clone, nullptr);
  EXPECT_EQ(clone->key("x"), SkipKey(ns, "x"));
}

}  // namespace
}  // namespace skip_api_test
}  // namespace skip
}  // namespace gpipe

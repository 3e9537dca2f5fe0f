// verify_skippables: every stash has one later pop. Ports tests/skip/test_verify_skippables.py.
#include "test_util.h"

#include <gpipe/pipe.h>
#include <gpipe/skip/skippable.h>

namespace gpipe {
namespace skip {
namespace skip_verify_test {
namespace {

using torch::nn::Sequential;

// A layer that only declares what it stashes and pops.
struct DeclareImpl : torch::nn::Module, Skippable {
  DeclareImpl(std::vector<std::string> stash, std::vector<std::string> pop)
      : Skippable(std::move(stash), std::move(pop)) {}
  torch::Tensor forward(torch::Tensor input) { return input; }
};
TORCH_MODULE(Declare);

Declare declare(std::vector<std::string> stash, std::vector<std::string> pop) {
  return Declare(std::move(stash), std::move(pop));
}
Declare stashes(const std::string& name) { return declare({name}, {}); }
Declare pops(const std::string& name) { return declare({}, {name}); }

TEST(VerifySkippablesTest, Matching) {
  EXPECT_NO_THROW(verify_skippables(Sequential(stashes("foo"), pops("foo"))));
}

TEST(VerifySkippablesTest, StashNotPop) {
  GPIPE_EXPECT_THROW_WITH(verify_skippables(Sequential(stashes("foo"))), c10::TypeError,
                          "* no module declared 'foo' as poppable but stashed");
}

TEST(VerifySkippablesTest, PopUnknown) {
  GPIPE_EXPECT_THROW_WITH(verify_skippables(Sequential(pops("foo"))), c10::TypeError,
                          "* '0' declared 'foo' as poppable but it was not stashed");
}

TEST(VerifySkippablesTest, StashAgain) {
  GPIPE_EXPECT_THROW_WITH(
      verify_skippables(Sequential(stashes("foo"), stashes("foo"), pops("foo"))), c10::TypeError,
      "* '1' redeclared 'foo' as stashable but not isolated by namespace");
}

TEST(VerifySkippablesTest, PopAgain) {
  GPIPE_EXPECT_THROW_WITH(verify_skippables(Sequential(stashes("foo"), pops("foo"), pops("foo"))),
                          c10::TypeError,
                          "* '2' redeclared 'foo' as poppable but not isolated by namespace");
}

TEST(VerifySkippablesTest, StashPopTogetherDifferentNames) {
  Declare both = declare({"bar"}, {"foo"});
  EXPECT_NO_THROW(verify_skippables(Sequential(stashes("foo"), both, pops("bar"))));
}

TEST(VerifySkippablesTest, StashPopTogetherSameName) {
  Declare both = declare({"foo"}, {"foo"});
  GPIPE_EXPECT_THROW_WITH(verify_skippables(Sequential(both)), c10::TypeError,
                          "* '0' declared 'foo' both as stashable and as poppable");
}

TEST(VerifySkippablesTest, DoubleStashPop) {
  Sequential model(stashes("foo"), pops("foo"), stashes("foo"), pops("foo"));
  // Every problem is listed, each on its own line, after one heading.
  try {
    verify_skippables(model);
    ADD_FAILURE() << "expected c10::TypeError";
  } catch (const c10::TypeError& error) {
    const std::string message = error.what();
    EXPECT_THAT(message, ::testing::HasSubstr("one or more pairs of stash and pop do not match:\n\n"
                                              "* '2' redeclared 'foo' as stashable but not "
                                              "isolated by namespace\n"
                                              "* '3' redeclared 'foo' as poppable but not "
                                              "isolated by namespace"));
  }
}

TEST(VerifySkippablesTest, DoubleStashPopButIsolated) {
  Namespace ns1;
  Namespace ns2;
  EXPECT_NO_THROW(
      verify_skippables(Sequential(isolate(stashes("foo"), ns1), isolate(pops("foo"), ns1),
                                   isolate(stashes("foo"), ns2), isolate(pops("foo"), ns2))));
}

TEST(VerifySkippablesTest, NonSkippableLayersAreIgnored) {
  EXPECT_NO_THROW(verify_skippables(
      Sequential(torch::nn::ReLU(), stashes("foo"), torch::nn::Tanh(), pops("foo"))));
}

TEST(VerifySkippablesTest, GPipeVerifiesOnConstruction) {
  GPIPE_EXPECT_THROW_WITH(
      GPipe(Sequential(stashes("foo"), torch::nn::ReLU()), GPipeOptions({1, 1})), c10::TypeError,
      "no module declared 'foo' as poppable but stashed");
}

}  // namespace
}  // namespace skip_verify_test
}  // namespace skip
}  // namespace gpipe

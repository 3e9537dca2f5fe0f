// Ports of torchgpipe's tests/test_bugs.py and tests/test_inplace.py: regressions of the reference.
#include "test_util.h"

#include <gpipe/gpipe.h>

namespace gpipe {
namespace bugs_test {
namespace {

using torch::nn::Sequential;

// A custom autograd function that returns its input as is must work inside a partition,
// checkpointed or not (Wait, Fork and Join must not trip over shared storage).
struct Identity : torch::autograd::Function<Identity> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor input) {
    return input;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grad) {
    return grad;
  }
};

TEST(BugsTest, CustomAutogradFunction) {
  auto identity = [] {
    return torch::nn::Functional([](torch::Tensor x) { return Identity::apply(x); });
  };
  GPipe model(Sequential(identity(), identity()),
              GPipeOptions({1, 1}).checkpoint(CheckpointMode::kAlways));
  auto x = torch::rand({42});
  auto y = model->forward(x);
  EXPECT_TRUE(torch::allclose(x, y));
}

struct ExpectedException : std::runtime_error {
  ExpectedException() : std::runtime_error("expected") {}
};

TEST(BugsTest, ExceptionNoHang) {
  auto pass = [] { return torch::nn::Functional([](torch::Tensor x) { return x; }); };
  auto raise =
      torch::nn::Functional([](torch::Tensor x) -> torch::Tensor { throw ExpectedException(); });
  GPipe model(Sequential(pass(), pass(), raise), GPipeOptions({1, 1, 1}).chunks(3));
  EXPECT_THROW(model->forward(torch::rand({3})), ExpectedException);
}

// Dropout in parallel micro-batches, recomputed under checkpointing: a zeroed output must have a
// zero gradient and vice versa, which holds only if the recomputed masks equal the forward ones.
TEST(BugsTest, ParallelRandoms) {
  auto dropouts = [] {
    return torch::nn::Functional([](torch::Tensor x) {
      for (int k = 0; k < 100; ++k) x = torch::dropout(x, 0.001, /*train=*/true);
      return x;
    });
  };
  auto x = torch::rand({10, 10}, torch::requires_grad());
  GPipe model(Sequential(dropouts(), dropouts()),
              GPipeOptions({1, 1}).chunks(10).checkpoint(CheckpointMode::kAlways));
  auto y = model->forward(x);
  y.norm().backward();
  EXPECT_TRUE(torch::equal(y.to(torch::kBool), x.grad().to(torch::kBool)));
  EXPECT_LT(y.to(torch::kBool).sum().item<int64_t>(), 100);  // some were dropped
}

TEST(InplaceTest, InplaceOnRequiresGrad) {
  GPipe model(Sequential(torch::nn::Linear(1, 1), torch::nn::ReLU(torch::nn::ReLUOptions(true))),
              GPipeOptions({1, 1}).checkpoint(CheckpointMode::kAlways));
  auto y = model->forward(torch::rand({1}));
  GPIPE_EXPECT_THROW_WITH(y.backward(), c10::Error,
                          "a leaf Variable that requires grad is being used in an in-place "
                          "operation");
}

// Like the reference (its xfail tests), in-place updates of tensors that need no grad inside a
// checkpointed partition are not detected: they are applied again by the recomputation.

}  // namespace
}  // namespace bugs_test
}  // namespace gpipe

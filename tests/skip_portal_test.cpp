// Portal: hiding a tensor from autograd and bringing its gradient back. Ports
// tests/skip/test_portal.py.
#include "test_util.h"

#include <gpipe/skip/portal.h>
#include "detail/dependency.h"
#include "detail/stream.h"

namespace gpipe {
namespace skip {
namespace skip_portal_test {
namespace {

using gpipe::detail::fork;
using gpipe::detail::join;

// output = tensor1 * 2 + tensor2, with tensor2 carried by a portal:
//
//                +----------------------+
//                |                      |
// tensor2 -- PortalBlue -+      +- PortalOrange -+
//                        |      |                |
// tensor1 ------------ Join -- Fork --- Mul --- Add -- output
torch::Tensor blue_orange(const torch::Tensor& tensor1, const torch::Tensor& tensor2) {
  auto portal = c10::make_intrusive<Portal>(tensor2, /*tensor_life=*/2);
  torch::Tensor main = join(tensor1, portal->blue());
  auto [forked, phony] = fork(main);
  torch::Tensor sub = portal->orange(phony);
  return forked * 2 + sub;
}

TEST(PortalTest, BlueOrange) {
  auto tensor1 = torch::rand({1}, torch::requires_grad());
  auto tensor2 = torch::rand({1}, torch::requires_grad());
  blue_orange(tensor1, tensor2).backward();
  EXPECT_TRUE(torch::allclose(tensor1.grad(), torch::tensor({2.0F})));
  EXPECT_TRUE(torch::allclose(tensor2.grad(), torch::tensor({1.0F})));
}

TEST(PortalTest, BlueOrangeNotRequiresGrad) {
  auto tensor1 = torch::rand({1}, torch::requires_grad());
  auto tensor2 = torch::rand({1});
  blue_orange(tensor1, tensor2).backward();
  EXPECT_TRUE(torch::allclose(tensor1.grad(), torch::tensor({2.0F})));
  EXPECT_FALSE(tensor2.grad().defined());
}

TEST(PortalTest, BlueWithoutOrangeGivesNoGradient) {
  // The popped tensor reaches no loss: PortalOrange never runs, and PortalBlue passes nothing.
  auto tensor1 = torch::rand({1}, torch::requires_grad());
  auto tensor2 = torch::rand({1}, torch::requires_grad());
  auto portal = c10::make_intrusive<Portal>(tensor2, 2);
  torch::Tensor main = join(tensor1, portal->blue());
  auto [forked, phony] = fork(main);
  portal->orange(phony);
  (forked * 3).backward();
  EXPECT_TRUE(torch::allclose(tensor1.grad(), torch::tensor({3.0F})));
  EXPECT_FALSE(tensor2.grad().defined());
}

TEST(PortalTest, UseGrad) {
  auto tensor = torch::rand({1}, torch::requires_grad());
  auto portal = c10::make_intrusive<Portal>(tensor, 1);
  portal->put_grad(tensor);
  EXPECT_TRUE(portal->use_grad().is_same(tensor));
  // A gradient in a portal is ephemeral.
  GPIPE_EXPECT_THROW_WITH(portal->use_grad(), c10::Error,
                          "grad in portal has been removed or never set");
}

TEST(PortalTest, UndefinedTensorMakesNoAutogradNode) {
  auto portal = c10::make_intrusive<Portal>(torch::Tensor(), 2);
  torch::Tensor phony = portal->blue();
  EXPECT_FALSE(phony.requires_grad());
  EXPECT_EQ(phony.numel(), 0);
  EXPECT_FALSE(portal->orange(torch::zeros({0}, torch::requires_grad())).defined());
  EXPECT_EQ(portal->tensor_life(), 0);
}

// Each TensorLifeTest must spend the whole life: the portal then holds no tensor and refuses.
class TensorLifeTest : public ::testing::Test {
 protected:
  c10::intrusive_ptr<Portal> new_portal(int64_t tensor_life) {
    tensor_ = torch::rand({1}, torch::requires_grad());
    portal_ = c10::make_intrusive<Portal>(tensor_, tensor_life);
    return portal_;
  }
  void TearDown() override {
    GPIPE_EXPECT_THROW_WITH(portal_->check_tensor_life(), c10::Error,
                            "tensor in portal has been removed");
    EXPECT_FALSE(portal_->tensor().defined());
  }
  torch::Tensor tensor_;
  c10::intrusive_ptr<Portal> portal_;
};

TEST_F(TensorLifeTest, TensorLife0) {
  auto portal = new_portal(0);
  EXPECT_FALSE(portal->tensor().defined());
}

TEST_F(TensorLifeTest, TensorLife1) {
  auto portal = new_portal(1);
  EXPECT_TRUE(portal->tensor().is_same(tensor_));
  portal->blue();
}

TEST_F(TensorLifeTest, TensorLife2) {
  auto portal = new_portal(2);
  torch::Tensor phony = portal->blue();
  EXPECT_EQ(portal->orange(phony).data_ptr(), tensor_.data_ptr());
}

TEST_F(TensorLifeTest, TensorLife3) {
  auto portal = new_portal(3);
  torch::Tensor phony = portal->blue();
  EXPECT_EQ(portal->orange(phony).data_ptr(), tensor_.data_ptr());
  EXPECT_EQ(portal->orange(phony).data_ptr(), tensor_.data_ptr());
}

TEST_F(TensorLifeTest, TensorLife4) {
  auto portal = new_portal(4);
  torch::Tensor phony = portal->blue();
  EXPECT_EQ(portal->orange(phony).data_ptr(), tensor_.data_ptr());
  EXPECT_EQ(portal->orange(phony).data_ptr(), tensor_.data_ptr());
  portal->blue();
}

TEST_F(TensorLifeTest, TensorLife3Plus1) {
  auto portal = new_portal(3);
  torch::Tensor phony = portal->blue();
  EXPECT_EQ(portal->orange(phony).data_ptr(), tensor_.data_ptr());
  EXPECT_EQ(portal->orange(phony).data_ptr(), tensor_.data_ptr());
  portal->put_tensor(torch::rand({1}, torch::requires_grad()), 1);
  portal->blue();
}

TEST(PortalTest, CopyReturnsOnNextDevice_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  auto portal = c10::make_intrusive<Portal>(torch::rand({1}), 1);
  const auto prev = gpipe::detail::default_stream(torch::Device(torch::kCPU));
  const auto next = gpipe::detail::default_stream(torch::Device(torch::kCUDA, 0));
  torch::Tensor phony = portal->copy(prev, next, torch::zeros({0}, torch::requires_grad()));
  EXPECT_TRUE(phony.device().is_cuda());
  EXPECT_TRUE(portal->tensor().device().is_cuda());
}

TEST(PortalTest, CopyCarriesTheGradientBack_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  const torch::Device cuda(torch::kCUDA, 0);
  auto tensor1 = torch::rand({1}, torch::requires_grad());
  auto tensor2 = torch::rand({1}, torch::requires_grad());
  auto portal = c10::make_intrusive<Portal>(tensor2, 2);
  torch::Tensor main = join(tensor1, portal->blue());
  auto [a, phony_a] = fork(main);
  main = join(a, portal->copy(gpipe::detail::default_stream(torch::Device(torch::kCPU)),
                              gpipe::detail::default_stream(cuda), phony_a));
  main = main.to(cuda);
  auto [b, phony_b] = fork(main);
  torch::Tensor sub = portal->orange(phony_b);
  EXPECT_TRUE(sub.device().is_cuda());
  (b * 2 + sub * 3).sum().backward();
  EXPECT_TRUE(torch::allclose(tensor1.grad(), torch::tensor({2.0F})));
  EXPECT_TRUE(torch::allclose(tensor2.grad(), torch::tensor({3.0F})));
}

}  // namespace
}  // namespace skip_portal_test
}  // namespace skip
}  // namespace gpipe

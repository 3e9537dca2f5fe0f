// Ports torchgpipe's tests/test_phony.py.
#include "test_util.h"

#include "detail/phony.h"

#include <c10/core/InferenceMode.h>
#include <torch/torch.h>

#include <thread>
#include <vector>

namespace gpipe {
namespace phony_test {
namespace {

using detail::get_phony;
using torch::autograd::AutogradContext;

const c10::Device kCpu(c10::kCPU);

TEST(PhonyTest, PhonySize) {
  torch::Tensor p = get_phony(kCpu, /*requires_grad=*/false);
  EXPECT_EQ(p.sizes(), (std::vector<int64_t>{0}));
  EXPECT_EQ(p.numel(), 0);
  EXPECT_TRUE(p.device().is_cpu());
}

TEST(PhonyTest, PhonyRequiresGrad) {
  torch::Tensor p1 = get_phony(kCpu, /*requires_grad=*/true);
  torch::Tensor p2 = get_phony(kCpu, /*requires_grad=*/false);
  EXPECT_TRUE(p1.requires_grad());
  EXPECT_FALSE(p2.requires_grad());
  // Phonies are leaves: nothing to differentiate through.
  EXPECT_FALSE(p1.grad_fn());
  EXPECT_FALSE(p2.grad_fn());
}

TEST(PhonyTest, CachedPhony) {
  torch::Tensor p1 = get_phony(kCpu, /*requires_grad=*/true);
  torch::Tensor p2 = get_phony(kCpu, /*requires_grad=*/true);
  EXPECT_TRUE(p1.is_same(p2));

  torch::Tensor p3 = get_phony(kCpu, /*requires_grad=*/false);
  torch::Tensor p4 = get_phony(kCpu, /*requires_grad=*/false);
  EXPECT_TRUE(p3.is_same(p4));

  EXPECT_FALSE(p1.is_same(p3));
}

TEST(PhonyTest, CachedPhonyAcrossThreads) {
  const torch::Tensor expected = get_phony(kCpu, /*requires_grad=*/true);
  std::vector<torch::Tensor> seen(8);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < seen.size(); ++k) {
    threads.emplace_back([&seen, k] { seen[k] = get_phony(kCpu, /*requires_grad=*/true); });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& p : seen) EXPECT_TRUE(p.is_same(expected));
}

TEST(PhonyTest, CachedPhonyIndexedCpuDevice) {
  // "cpu" and "cpu:0" are distinct keys, but both give a usable CPU phony.
  torch::Tensor p = get_phony(c10::Device(c10::kCPU, 0), /*requires_grad=*/false);
  EXPECT_EQ(p.numel(), 0);
  EXPECT_TRUE(p.device().is_cpu());
  EXPECT_TRUE(p.is_same(get_phony(c10::Device(c10::kCPU, 0), /*requires_grad=*/false)));
}

TEST(PhonyTest, PhonyUnderInferenceModeIsNormalTensor) {
  torch::Tensor p;
  {
    c10::InferenceMode guard;
    p = get_phony(kCpu, /*requires_grad=*/true);
  }
  EXPECT_FALSE(p.is_inference());
  EXPECT_TRUE(p.requires_grad());
  // It can still take part in autograd.
  torch::Tensor x = torch::ones({2}, torch::requires_grad());
  torch::Tensor y = x.sum() + p.sum();
  y.backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::ones({2})));
}

struct Phonify : torch::autograd::Function<Phonify> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) {
    return get_phony(input.device(), /*requires_grad=*/false).detach();
  }
  static torch::autograd::variable_list backward(AutogradContext*,
                                                 torch::autograd::variable_list grad) {
    return {torch::Tensor()};
  }
};

TEST(PhonyTest, PhonyInAutogradFunction) {
  torch::Tensor x = torch::rand({1}, torch::requires_grad());

  torch::Tensor p1 = Phonify::apply(x);
  torch::Tensor p2 = get_phony(kCpu, /*requires_grad=*/true);

  EXPECT_FALSE(p1.is_same(p2));
  EXPECT_TRUE(p1.grad_fn());
  EXPECT_FALSE(p2.grad_fn());
  EXPECT_EQ(p1.numel(), 0);
  // The cached phony was not turned into an autograd output.
  EXPECT_FALSE(get_phony(kCpu, /*requires_grad=*/false).requires_grad());
  EXPECT_FALSE(get_phony(kCpu, /*requires_grad=*/false).grad_fn());
}

TEST(PhonyTest, PhonyCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  c10::Device cuda(c10::kCUDA, 0);
  torch::Tensor p1 = get_phony(cuda, /*requires_grad=*/false);
  torch::Tensor p2 = get_phony(cuda, /*requires_grad=*/false);
  EXPECT_TRUE(p1.device().is_cuda());
  EXPECT_EQ(p1.numel(), 0);
  EXPECT_TRUE(p1.is_same(p2));
  EXPECT_FALSE(p1.is_same(get_phony(kCpu, /*requires_grad=*/false)));
}

}  // namespace
}  // namespace phony_test
}  // namespace gpipe

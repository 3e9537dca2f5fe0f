// Ports torchgpipe's tests/test_copy.py.
#include "test_util.h"

#include "detail/copy.h"
#include "detail/stream.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace gpipe {
namespace copy_test {
namespace {

using detail::copy;
using detail::current_stream;
using detail::new_stream;
using detail::UseStream;
using detail::wait;

const c10::Stream kCpuStream(c10::Stream::DEFAULT, c10::Device(c10::kCPU));

std::string node_name(const torch::Tensor& x) { return x.grad_fn() ? x.grad_fn()->name() : ""; }

// Copies ones(100) from `prev` to `next`, waits, and differentiates the norm back.
void test_copy_wait(const c10::Stream& prev_stream, const c10::Stream& next_stream) {
  const c10::Device prev_device = prev_stream.device();
  const c10::Device next_device = next_stream.device();

  torch::Tensor x;
  {
    UseStream use(prev_stream);
    x = torch::ones({100}, torch::device(prev_device).requires_grad(true));
  }

  std::vector<torch::Tensor> copied = copy({x}, prev_stream, next_stream);
  ASSERT_EQ(copied.size(), 1u);
  torch::Tensor y = copied[0];
  EXPECT_EQ(y.device(), next_device);
  EXPECT_THAT(node_name(y), ::testing::HasSubstr("Copy"));

  std::vector<torch::Tensor> waited = wait({y}, prev_stream, next_stream);
  ASSERT_EQ(waited.size(), 1u);
  torch::Tensor z = waited[0];
  EXPECT_EQ(z.device(), next_device);
  EXPECT_THAT(node_name(z), ::testing::HasSubstr("Wait"));

  {
    UseStream use(next_stream);
    EXPECT_TRUE(torch::allclose(z.sum(), torch::tensor(100.0, torch::device(next_device))));
    z.norm().backward();
  }
  {
    UseStream use(prev_stream);
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().device(), prev_device);
    // d|x|/dx = x / |x| = 1/10 for each of the 100 ones.
    EXPECT_TRUE(torch::allclose(x.grad().sum(), torch::tensor(10.0, torch::device(prev_device))));
  }
}

TEST(CopyTest, CopyWaitCpuCpu) { test_copy_wait(kCpuStream, kCpuStream); }

TEST(CopyTest, CopyWaitCpuCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  test_copy_wait(kCpuStream, current_stream(c10::Device(c10::kCUDA)));
}

TEST(CopyTest, CopyWaitCudaCpu_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  test_copy_wait(current_stream(c10::Device(c10::kCUDA)), kCpuStream);
}

TEST(CopyTest, CopyWaitCudaCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  test_copy_wait(current_stream(c10::Device(c10::kCUDA)), new_stream(c10::Device(c10::kCUDA)));
}

TEST(CopyTest, WaitMultipleTensors) {
  torch::Tensor a = torch::rand({1}, torch::requires_grad());
  torch::Tensor b = torch::rand({1}, torch::requires_grad());

  std::vector<torch::Tensor> out = wait({a, b}, kCpuStream, kCpuStream);
  ASSERT_EQ(out.size(), 2u);

  EXPECT_TRUE(out[0].grad_fn());
  EXPECT_EQ(out[0].grad_fn(), out[1].grad_fn());
  EXPECT_THAT(node_name(out[0]), ::testing::HasSubstr("Wait"));
  EXPECT_TRUE(torch::equal(out[0], a));
  EXPECT_TRUE(torch::equal(out[1], b));
}

TEST(CopyTest, CopyMultipleTensors) {
  torch::Tensor a = torch::rand({2}, torch::requires_grad());
  torch::Tensor b = torch::rand({3}, torch::requires_grad());

  std::vector<torch::Tensor> out = copy({a, b}, kCpuStream, kCpuStream);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].grad_fn(), out[1].grad_fn());
  EXPECT_THAT(node_name(out[0]), ::testing::HasSubstr("Copy"));
  EXPECT_TRUE(torch::equal(out[0], a));
  EXPECT_TRUE(torch::equal(out[1], b));

  (out[0].sum() * 2 + out[1].sum() * 3).backward();
  EXPECT_TRUE(torch::equal(a.grad(), torch::full({2}, 2.0f)));
  EXPECT_TRUE(torch::equal(b.grad(), torch::full({3}, 3.0f)));
}

TEST(CopyTest, CopyDetachesNonFloatingOutputs) {
  torch::Tensor x = torch::rand({2}, torch::requires_grad());
  torch::Tensor index = torch::tensor({1, 0});
  torch::Tensor flags = torch::tensor({true, false});

  std::vector<torch::Tensor> out = copy({x, index, flags}, kCpuStream, kCpuStream);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_FALSE(out[1].grad_fn());
  EXPECT_FALSE(out[2].requires_grad());
  EXPECT_FALSE(out[2].grad_fn());
  EXPECT_TRUE(torch::equal(out[1], index));
  EXPECT_TRUE(torch::equal(out[2], flags));

  // The floating output still differentiates, through the non-floating ones' indices.
  (out[0].index_select(0, out[1]) * torch::tensor({3.0f, 5.0f})).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::tensor({5.0f, 3.0f})));
}

TEST(CopyTest, WaitDetachesNonFloatingOutputs) {
  torch::Tensor x = torch::rand({2}, torch::requires_grad());
  torch::Tensor index = torch::tensor({1, 0});

  std::vector<torch::Tensor> out = wait({x, index}, kCpuStream, kCpuStream);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_FALSE(out[1].grad_fn());
  EXPECT_TRUE(torch::equal(out[1], index));

  out[0].sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::ones({2})));
}

TEST(CopyTest, CopyWaitWithoutGrad) {
  torch::Tensor x = torch::rand({3});
  std::vector<torch::Tensor> copied = copy({x}, kCpuStream, kCpuStream);
  std::vector<torch::Tensor> waited = wait(copied, kCpuStream, kCpuStream);
  EXPECT_FALSE(waited[0].requires_grad());
  EXPECT_TRUE(torch::equal(waited[0], x));
}

TEST(CopyTest, CopyToCudaAndBack_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  const c10::Stream cuda_stream = new_stream(c10::Device(c10::kCUDA));
  torch::Tensor x = torch::rand({4}, torch::requires_grad());
  torch::Tensor index = torch::tensor({3, 2, 1, 0});

  std::vector<torch::Tensor> out = copy({x, index}, kCpuStream, cuda_stream);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].is_cuda());
  EXPECT_TRUE(out[1].is_cuda());
  EXPECT_FALSE(out[1].requires_grad());
  out = wait(out, cuda_stream, current_stream(c10::Device(c10::kCUDA)));
  EXPECT_TRUE(torch::equal(out[0].cpu(), x));
  EXPECT_TRUE(torch::equal(out[1].cpu(), index));

  (out[0] * 2).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(x.grad().device().is_cpu());
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({4}, 2.0f)));
}

}  // namespace
}  // namespace copy_test
}  // namespace gpipe

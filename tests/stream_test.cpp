// Ports torchgpipe's tests/test_stream.py.
#include "test_util.h"

#include "detail/stream.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

namespace gpipe {
namespace stream_test {
namespace {

using detail::current_stream;
using detail::default_stream;
using detail::is_cpu;
using detail::new_stream;
using detail::normalize_device;
using detail::record_stream;
using detail::UseStream;
using detail::wait_stream;

const c10::Device kCpu(c10::kCPU);
const c10::Device kCuda(c10::kCUDA);
const c10::Stream kCpuStream(c10::Stream::DEFAULT, kCpu);

const c10::impl::DeviceGuardImplInterface& cuda_impl() {
  return *c10::impl::getDeviceGuardImpl(c10::kCUDA);
}

TEST(StreamTest, NewStreamCpu) {
  c10::Stream stream = new_stream(kCpu);
  EXPECT_EQ(stream, kCpuStream);
  EXPECT_TRUE(is_cpu(stream));
}

TEST(StreamTest, NewStreamCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  c10::Stream stream = new_stream(kCuda);
  EXPECT_EQ(stream.device_type(), c10::kCUDA);
  EXPECT_FALSE(is_cpu(stream));
  EXPECT_NE(stream, default_stream(kCuda));
  EXPECT_NE(stream, cuda_impl().getDefaultStream(c10::Device(c10::kCUDA, 0)));
}

TEST(StreamTest, CurrentStreamCpu) {
  c10::Stream stream = current_stream(kCpu);
  EXPECT_EQ(stream, kCpuStream);
  EXPECT_TRUE(is_cpu(stream));
  // An indexed CPU device is the same placeholder.
  EXPECT_EQ(current_stream(c10::Device(c10::kCPU, 0)), kCpuStream);
}

TEST(StreamTest, CurrentStreamCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  c10::Stream stream = current_stream(kCuda);
  EXPECT_EQ(stream.device_type(), c10::kCUDA);
  EXPECT_EQ(stream, cuda_impl().getStream(cuda_impl().getDevice()));
}

TEST(StreamTest, DefaultStreamCpu) {
  c10::Stream stream = default_stream(kCpu);
  EXPECT_EQ(stream, kCpuStream);
  EXPECT_TRUE(is_cpu(stream));
}

TEST(StreamTest, DefaultStreamCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  c10::Stream stream = default_stream(kCuda);
  EXPECT_EQ(stream.device_type(), c10::kCUDA);
  EXPECT_EQ(stream, cuda_impl().getDefaultStream(cuda_impl().getDevice()));
}

TEST(StreamTest, UseStreamCpu) {
  {
    UseStream use(kCpuStream);
    EXPECT_EQ(current_stream(kCpu), kCpuStream);
  }
  EXPECT_EQ(current_stream(kCpu), kCpuStream);
}

TEST(StreamTest, UseStreamCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  const c10::Stream before = current_stream(kCuda);
  c10::Stream stream = new_stream(kCuda);
  ASSERT_NE(stream, before);
  {
    UseStream use(stream);
    EXPECT_EQ(current_stream(kCuda), stream);
  }
  EXPECT_EQ(current_stream(kCuda), before);
}

TEST(StreamTest, GetDeviceCpu) { EXPECT_EQ(kCpuStream.device().type(), c10::kCPU); }

TEST(StreamTest, GetDeviceCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  EXPECT_EQ(current_stream(kCuda).device().type(), c10::kCUDA);
}

TEST(StreamTest, NormalizeDevice) {
  EXPECT_EQ(normalize_device(kCpu), kCpu);
  EXPECT_EQ(normalize_device(c10::Device(c10::kCPU, 0)), kCpu);
}

TEST(StreamTest, NormalizeDevice_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  EXPECT_EQ(normalize_device(kCuda), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(normalize_device(c10::Device(c10::kCUDA, 0)), c10::Device(c10::kCUDA, 0));
}

// Makes x on `target`, then has `source` wait for it and reads it there.
void test_wait_stream(const c10::Stream& source, const c10::Stream& target) {
  torch::Tensor x;
  {
    UseStream use(target);
    // Enough work for the target stream to be still busy when the source reads.
    torch::Tensor a = torch::ones({512, 512}, torch::device(target.device()));
    for (int k = 0; k < 4; ++k) a = torch::mm(a, a) / 512;
    x = torch::ones({100, 100}, torch::device(target.device())) * a.mean();
  }

  wait_stream(source, target);

  {
    UseStream use(source);
    EXPECT_EQ(x.sum().item<float>(), 10000.0f);
  }
}

TEST(StreamTest, WaitStreamCpuCpu) { test_wait_stream(kCpuStream, kCpuStream); }

TEST(StreamTest, WaitStreamCpuCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  test_wait_stream(kCpuStream, new_stream(kCuda));
}

TEST(StreamTest, WaitStreamCudaCpu_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  test_wait_stream(new_stream(kCuda), kCpuStream);
}

TEST(StreamTest, WaitStreamCudaCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  test_wait_stream(current_stream(kCuda), new_stream(kCuda));
}

TEST(StreamTest, RecordStreamCpu) {
  // Silently ignores CPU tensors, undefined tensors and CPU streams.
  torch::Tensor x = torch::rand({1});
  EXPECT_NO_THROW(record_stream(x, kCpuStream));
  EXPECT_NO_THROW(record_stream(torch::Tensor(), kCpuStream));
}

// Queues enough work on `stream` to keep it busy for a while (no cuda sleep in LibTorch's API).
void keep_busy(const c10::Stream& stream) {
  UseStream use(stream);
  torch::Tensor a = torch::rand({4096, 4096}, torch::device(stream.device()));
  for (int k = 0; k < 50; ++k) a = torch::mm(a, a).clamp_(-1, 1);
}

TEST(StreamTest, RecordStream_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  // The allocator does not reuse free blocks of another stream's pool, so `x` lives alone on
  // stream_alloc's pool; only record_stream can keep its block from being reused.
  c10::Stream stream_alloc = new_stream(kCuda);
  torch::Tensor x;
  {
    UseStream use(stream_alloc);
    x = torch::rand({1}, torch::device(kCuda));
  }

  c10::Stream stream = new_stream(kCuda);
  ASSERT_NE(stream, stream_alloc);
  record_stream(x, stream);
  keep_busy(stream);

  // x is gone, but its block is still needed by `stream`: y must not get it.
  const void* data_ptr = x.data_ptr();
  x = torch::Tensor();
  stream_alloc.synchronize();
  torch::Tensor y;  // kept alive, so that z below cannot take its block instead
  {
    UseStream use(stream_alloc);
    y = torch::rand({1}, torch::device(kCuda));
    EXPECT_NE(y.data_ptr(), data_ptr);
  }

  // Once `stream` has finished, the block is free again.
  wait_stream(kCpuStream, stream);
  {
    UseStream use(stream_alloc);
    torch::Tensor z = torch::rand({1}, torch::device(kCuda));
    EXPECT_EQ(z.data_ptr(), data_ptr);
  }
}

TEST(StreamTest, RecordStreamShiftedView_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  // https://github.com/pytorch/pytorch/issues/27366: recording a view must protect the whole
  // block, not the view's shifted pointer.
  c10::Stream stream_alloc = new_stream(kCuda);
  torch::Tensor x;
  {
    UseStream use(stream_alloc);
    x = torch::rand({2}, torch::device(kCuda));
  }

  torch::Tensor y = x.slice(0, 1);
  ASSERT_GT(reinterpret_cast<uintptr_t>(y.data_ptr()), reinterpret_cast<uintptr_t>(x.data_ptr()));

  c10::Stream stream = new_stream(kCuda);
  keep_busy(stream);
  record_stream(y, stream);

  const void* data_ptr = x.data_ptr();
  x = torch::Tensor();
  y = torch::Tensor();

  stream_alloc.synchronize();
  {
    UseStream use(stream_alloc);
    torch::Tensor z = torch::rand({2}, torch::device(kCuda));
    EXPECT_NE(z.data_ptr(), data_ptr);
  }
  wait_stream(kCpuStream, stream);
}

}  // namespace
}  // namespace stream_test
}  // namespace gpipe

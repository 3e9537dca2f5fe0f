// Ports torchgpipe's tests/test_stream.py.
#include "test_util.h"

#include "detail/copy.h"
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

// A device whose streams run nothing and whose guard counts what the stream logic asks of it:
// PrivateUse1, which nothing else in the tests registers. It shows on a machine without a GPU
// what the pipeline's stream logic would do to one: events between streams, no synchronization.
struct GuardCalls {
  int record = 0, block = 0, synchronize_stream = 0, synchronize_event = 0,
      synchronize_device = 0, record_data_ptr = 0;
};
GuardCalls guard_calls;
const c10::Device kCounted(c10::DeviceType::PrivateUse1, 0);

struct CountingGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device device) const override { return device; }
  c10::Device getDevice() const override { return kCounted; }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::UNSAFE, device, current_);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override {
    return c10::Stream(c10::Stream::UNSAFE, device, ++pooled_);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    const c10::Stream previous = getStream(stream.device());
    current_ = stream.id();
    return previous;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    ++guard_calls.record;
    *event = &guard_calls;  // any non-null handle
  }
  void block(void*, const c10::Stream&) const override { ++guard_calls.block; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void synchronizeStream(const c10::Stream&) const override { ++guard_calls.synchronize_stream; }
  void synchronizeEvent(void*) const override { ++guard_calls.synchronize_event; }
  void synchronizeDevice(const c10::DeviceIndex) const override {
    ++guard_calls.synchronize_device;
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {
    ++guard_calls.record_data_ptr;
  }

 private:
  mutable c10::StreamId current_ = 0;
  mutable c10::StreamId pooled_ = 0;
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, CountingGuardImpl);

TEST(StreamTest, DeviceStreamsWaitOnAnEventNeverASynchronization) {
  const c10::Stream a = new_stream(kCounted), b = new_stream(kCounted);
  ASSERT_NE(a, b);
  guard_calls = {};
  wait_stream(a, b);
  EXPECT_EQ(guard_calls.record, 1);
  EXPECT_EQ(guard_calls.block, 1);
  EXPECT_EQ(guard_calls.synchronize_stream + guard_calls.synchronize_event +
                guard_calls.synchronize_device,
            0);

  // The CPU waits for a device stream by synchronizing that stream alone; a device stream needs
  // nothing to wait for the CPU, whose work is done when it returns.
  guard_calls = {};
  wait_stream(kCpuStream, b);
  EXPECT_EQ(guard_calls.synchronize_stream, 1);
  EXPECT_EQ(guard_calls.synchronize_device, 0);
  guard_calls = {};
  wait_stream(b, kCpuStream);
  EXPECT_EQ(guard_calls.record + guard_calls.block + guard_calls.synchronize_stream, 0);
}

TEST(StreamTest, WaitBetweenDeviceStreamsIsOneEventEachWay) {
  // detail::wait, the pipeline's Wait between a partition's copy and compute streams: one event
  // in forward (next waits for prev) and one in backward (prev waits for next), no
  // synchronization; it records nothing on the allocator (the tensors stay where they are).
  const c10::Stream prev = new_stream(kCounted), next = new_stream(kCounted);
  torch::Tensor x = torch::rand({4}, torch::requires_grad());
  guard_calls = {};
  torch::Tensor y = detail::wait({x}, prev, next)[0];
  EXPECT_EQ(guard_calls.record, 1);
  EXPECT_EQ(guard_calls.block, 1);
  y.sum().backward();
  EXPECT_EQ(guard_calls.record, 2);
  EXPECT_EQ(guard_calls.block, 2);
  EXPECT_EQ(guard_calls.synchronize_stream + guard_calls.synchronize_event +
                guard_calls.synchronize_device + guard_calls.record_data_ptr,
            0);
  EXPECT_TRUE(x.grad().equal(torch::ones({4})));
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

#include "test_util.h"

#include "gpipe/memory.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <thread>
#include <vector>

namespace gpipe {
namespace memory_test {
namespace {

using memory::cpu_current_bytes;
using memory::cpu_peak_bytes;
using memory::cpu_worker_current_bytes;
using memory::cpu_worker_peak_bytes;

TEST(MemoryTest, InstallIsIdempotent) {
  memory::install_tracking_cpu_allocator();
  c10::Allocator* installed = c10::GetCPUAllocator();
  memory::install_tracking_cpu_allocator();
  EXPECT_TRUE(memory::tracking_cpu_allocator_installed());
  EXPECT_EQ(c10::GetCPUAllocator(), installed);
  EXPECT_NE(installed, c10::GetDefaultCPUAllocator());
}

TEST(MemoryTest, CountsExactBytes) {
  memory::install_tracking_cpu_allocator();
  const int64_t before = cpu_current_bytes();
  {
    torch::Tensor a = torch::empty({1000}, torch::kFloat);
    EXPECT_EQ(cpu_current_bytes() - before, 4000);
    torch::Tensor b = torch::empty({3, 5}, torch::kDouble);
    EXPECT_EQ(cpu_current_bytes() - before, 4000 + 120);
    torch::Tensor view = a.narrow(0, 0, 10);  // no new memory
    EXPECT_EQ(cpu_current_bytes() - before, 4120);
  }
  EXPECT_EQ(cpu_current_bytes(), before);
}

TEST(MemoryTest, PeakAndReset) {
  memory::install_tracking_cpu_allocator();
  memory::reset_cpu_peak();
  const int64_t before = cpu_current_bytes();
  EXPECT_EQ(cpu_peak_bytes(), before);
  { torch::Tensor big = torch::empty({1 << 20}, torch::kByte); }
  torch::Tensor small = torch::empty({100}, torch::kByte);
  EXPECT_EQ(cpu_peak_bytes() - before, 1 << 20);
  memory::reset_cpu_peak();
  EXPECT_EQ(cpu_peak_bytes() - before, 100);
}

TEST(MemoryTest, ZeroBytesAndRawAllocations) {
  memory::install_tracking_cpu_allocator();
  const int64_t before = cpu_current_bytes();
  torch::Tensor empty = torch::empty({0});
  EXPECT_EQ(cpu_current_bytes(), before);

  c10::Allocator* allocator = c10::GetCPUAllocator();
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  void* raw = allocator->raw_allocate(777);
  ASSERT_NE(raw, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(raw) % 64, 0u);
  EXPECT_EQ(cpu_current_bytes() - before, 777);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(cpu_current_bytes(), before);
}

TEST(MemoryTest, ThreadsCountExactly) {
  memory::install_tracking_cpu_allocator();
  const int64_t before = cpu_current_bytes();
  memory::reset_cpu_peak();
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  std::atomic<int> holding{0};
  std::atomic<bool> all_held{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r) torch::Tensor x = torch::empty({256}, torch::kFloat);
      torch::Tensor held = torch::empty({1024}, torch::kByte);
      if (++holding == kThreads) all_held = true;
      while (!all_held) std::this_thread::yield();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(cpu_current_bytes(), before);
  // Every thread held 1024 bytes at once at some point.
  EXPECT_GE(cpu_peak_bytes() - before, kThreads * 1024);
  EXPECT_LE(cpu_peak_bytes() - before, kThreads * (1024 + 1024));
}

TEST(MemoryTest, TagsCountWhatTheirThreadAllocated) {
  memory::install_tracking_cpu_allocator();
  memory::reset_cpu_peak();
  const int64_t before3 = cpu_current_bytes(3);
  const int64_t before5 = cpu_current_bytes(5);
  torch::Tensor kept;
  {
    memory::ScopedTag stage3(3);
    torch::Tensor a = torch::empty({1000}, torch::kByte);
    kept = torch::empty({200}, torch::kByte);
    {
      memory::ScopedTag stage5(5);
      torch::Tensor b = torch::empty({50}, torch::kByte);
      EXPECT_EQ(cpu_current_bytes(5) - before5, 50);
      EXPECT_EQ(cpu_current_bytes(3) - before3, 1200);  // nested: only the innermost tag counts
    }
    EXPECT_EQ(cpu_peak_bytes(5) - before5, 50);
  }
  torch::Tensor untagged = torch::empty({4000}, torch::kByte);
  EXPECT_EQ(cpu_current_bytes(3) - before3, 200);
  EXPECT_EQ(cpu_peak_bytes(3) - before3, 1200);
  // Freed on another thread: still returned to the tag that allocated it.
  std::thread([moved = std::move(kept)]() mutable { moved = torch::Tensor(); }).join();
  EXPECT_EQ(cpu_current_bytes(3), before3);
  memory::reset_cpu_peak();
  EXPECT_EQ(cpu_peak_bytes(3), before3);
}

// A worker's tag counts what its thread allocates under any stage tag: its peak is the peak of
// the sum, not the sum of the stages' peaks.
TEST(MemoryTest, WorkerTagCountsEveryStageOfItsThread) {
  memory::install_tracking_cpu_allocator();
  const int64_t before = cpu_worker_current_bytes(7);
  memory::reset_cpu_peak();
  {
    memory::ScopedWorkerTag worker(7);
    {
      memory::ScopedTag stage2(2);
      torch::Tensor a = torch::empty({1000}, torch::kByte);
    }
    torch::Tensor b;
    {
      memory::ScopedTag stage4(4);
      b = torch::empty({600}, torch::kByte);
    }
    EXPECT_EQ(cpu_worker_current_bytes(7) - before, 600);
    // Freed on another thread: returned to the worker that allocated it.
    std::thread([moved = std::move(b)]() mutable { moved = torch::Tensor(); }).join();
  }
  torch::Tensor untagged = torch::empty({4000}, torch::kByte);
  EXPECT_EQ(cpu_worker_current_bytes(7), before);
  EXPECT_EQ(cpu_worker_peak_bytes(7) - before, 1000);
  GPIPE_EXPECT_THROW_WITH((void)memory::ScopedWorkerTag(memory::kMaxTags), c10::IndexError,
                          "memory tag 64 is out of range [0, 64)");
}

TEST(MemoryTest, TagOutOfRange) {
  GPIPE_EXPECT_THROW_WITH((void)memory::ScopedTag(memory::kMaxTags), c10::IndexError,
                          "memory tag 64 is out of range [0, 64)");
  GPIPE_EXPECT_THROW_WITH(memory::cpu_peak_bytes(-1), c10::IndexError, "memory tag -1");
}

// The device-generic calls read the tracking allocator for the CPU.
TEST(MemoryTest, CpuDeviceStatisticsAreTheTrackingAllocators) {
  memory::install_tracking_cpu_allocator();
  const torch::Device cpu(torch::kCPU);
  memory::reset_peak(cpu);
  const int64_t before = memory::current_bytes(cpu);
  EXPECT_EQ(before, cpu_current_bytes());
  {
    torch::Tensor a = torch::empty({1 << 16}, torch::kFloat);
    EXPECT_EQ(memory::current_bytes(cpu), before + (1 << 18));
  }
  EXPECT_EQ(memory::current_bytes(cpu), before);
  EXPECT_EQ(memory::peak_bytes(cpu), before + (1 << 18));
  EXPECT_EQ(memory::peak_bytes(cpu), cpu_peak_bytes());
  memory::reset_peak(cpu);
  EXPECT_EQ(memory::peak_bytes(cpu), before);
}

TEST(MemoryTest, DeviceStatisticsNameAnUnsupportedDevice) {
  GPIPE_EXPECT_THROW_WITH(memory::current_bytes(torch::Device(torch::kMeta)), c10::ValueError,
                          "memory statistics exist for CPU and CUDA devices, not for meta");
  if (!torch::cuda::is_available()) {
    // Without CUDA in LibTorch, or without a device: an error that says which, never a zero.
    EXPECT_THROW(memory::peak_bytes(torch::Device(torch::kCUDA, 0)), c10::Error);
  }
}

// On CUDA the caching allocator's allocated bytes of the device.
TEST(MemoryTest, CudaDeviceStatisticsCountTensors_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  const torch::Device cuda(torch::kCUDA, 0);
  const int64_t before = memory::current_bytes(cuda);
  memory::reset_peak(cuda);
  {
    torch::Tensor a = torch::empty({1 << 20}, torch::TensorOptions(cuda).dtype(torch::kFloat));
    EXPECT_EQ(memory::current_bytes(cuda), before + (4 << 20));
    EXPECT_EQ(memory::current_bytes(torch::kCUDA), before + (4 << 20));  // the current device
  }
  EXPECT_EQ(memory::current_bytes(cuda), before);
  EXPECT_EQ(memory::peak_bytes(cuda), before + (4 << 20));
  memory::reset_peak(cuda);
  EXPECT_EQ(memory::peak_bytes(cuda), before);
}

}  // namespace
}  // namespace memory_test
}  // namespace gpipe

// Ports torchgpipe's tests/test_worker.py, plus the C++ device thread's exception and state
// handling.
#include "test_util.h"

#include "detail/device_thread.h"
#include "detail/stream.h"

#include <c10/core/InferenceMode.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace gpipe {
namespace device_thread_test {
namespace {

using detail::Completion;
using detail::DeviceThread;
using detail::Task;

const c10::Device kCpu(c10::kCPU);

// The calling thread's state, for Task::caller.
std::shared_ptr<const detail::CallerState> here() {
  return std::make_shared<const detail::CallerState>();
}

Task make_task(std::function<Batch()> compute) {
  Task task;
  task.compute = std::move(compute);
  task.caller = here();
  return task;
}

std::vector<std::unique_ptr<DeviceThread>> spawn_threads(size_t count) {
  std::vector<std::unique_ptr<DeviceThread>> threads;
  for (size_t k = 0; k < count; ++k) threads.push_back(std::make_unique<DeviceThread>(kCpu));
  return threads;
}

TEST(DeviceThreadTest, JoinRunningThreads) {
  std::atomic<int> count{0};
  auto counter = [&count] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ++count;
    return Batch(std::vector<torch::Tensor>{});
  };

  {
    auto threads = spawn_threads(10);
    for (auto& thread : threads) thread->submit(make_task(counter));
  }

  // No nondeterminism: destroying a thread runs what was submitted, then joins.
  EXPECT_EQ(count.load(), 10);
}

struct ExpectedException : std::runtime_error {
  ExpectedException() : std::runtime_error("expected") {}
};

TEST(DeviceThreadTest, JoinRunningThreadsWithException) {
  std::atomic<int> count{0};
  auto counter = [&count] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ++count;
    return Batch(std::vector<torch::Tensor>{});
  };

  EXPECT_THROW(
      {
        auto threads = spawn_threads(10);
        for (auto& thread : threads) thread->submit(make_task(counter));
        throw ExpectedException();
      },
      ExpectedException);

  EXPECT_EQ(count.load(), 10);
}

TEST(DeviceThreadTest, ComputeMultithreading) {
  // Task::compute runs on the device threads, one thread each.
  std::mutex mutex;
  std::set<std::thread::id> thread_ids;
  auto log_thread_id = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    thread_ids.insert(std::this_thread::get_id());
    return Batch(std::vector<torch::Tensor>{});
  };

  auto threads = spawn_threads(2);
  for (auto& thread : threads) thread->submit(make_task(log_thread_id));
  for (auto& thread : threads) thread->take();

  EXPECT_EQ(thread_ids.size(), 2u);
  EXPECT_EQ(thread_ids.count(std::this_thread::get_id()), 0u);
}

TEST(DeviceThreadTest, ComputeRunsConcurrently) {
  // Two threads each sleep 300 ms; together they finish well before 600 ms.
  auto threads = spawn_threads(2);
  auto sleep = [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return Batch(std::vector<torch::Tensor>{});
  };
  const auto start = std::chrono::steady_clock::now();
  for (auto& thread : threads) thread->submit(make_task(sleep));
  for (auto& thread : threads) thread->take();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::milliseconds(550));
}

TEST(DeviceThreadTest, ComputeSuccess) {
  DeviceThread thread(kCpu);
  int finalized = 0;
  Task task = make_task([] { return Batch(torch::tensor(42)); });
  task.finalize = [&finalized](Batch&) { ++finalized; };
  thread.submit(std::move(task));

  Completion done = thread.take();

  EXPECT_FALSE(done.error);
  ASSERT_TRUE(done.batch.has_value());
  EXPECT_TRUE(done.batch->atomic());
  EXPECT_EQ((*done.batch)[0].item<int64_t>(), 42);
  // The task comes back with the completion, and finalize is left to the caller.
  EXPECT_EQ(finalized, 0);
  ASSERT_TRUE(done.task.finalize);
  done.task.finalize(*done.batch);
  EXPECT_EQ(finalized, 1);
  EXPECT_TRUE(done.task.compute);
}

TEST(DeviceThreadTest, ComputeException) {
  DeviceThread thread(kCpu);
  thread.submit(make_task([]() -> Batch { throw std::domain_error("zero division"); }));

  Completion done = thread.take();

  EXPECT_FALSE(done.batch.has_value());
  ASSERT_TRUE(done.error);
  EXPECT_THROW(std::rethrow_exception(done.error), std::domain_error);
}

TEST(DeviceThreadTest, ComputeExceptionKeepsType) {
  DeviceThread thread(kCpu);
  thread.submit(make_task([]() -> Batch {
    TORCH_CHECK_VALUE(false, "bad value: ", 7);
    return Batch(torch::Tensor());
  }));
  thread.submit(make_task([]() -> Batch {
    TORCH_CHECK_INDEX(false, "bad index");
    return Batch(torch::Tensor());
  }));
  thread.submit(make_task([] {
    // A torch error raised by an operator on the thread.
    return Batch(torch::mm(torch::ones({2, 3}), torch::ones({2, 3})));
  }));

  Completion value_error = thread.take();
  ASSERT_TRUE(value_error.error);
  GPIPE_EXPECT_THROW_WITH(std::rethrow_exception(value_error.error), c10::ValueError,
                          "bad value: 7");

  Completion index_error = thread.take();
  ASSERT_TRUE(index_error.error);
  GPIPE_EXPECT_THROW_WITH(std::rethrow_exception(index_error.error), c10::IndexError, "bad index");

  Completion op_error = thread.take();
  ASSERT_TRUE(op_error.error);
  EXPECT_THROW(std::rethrow_exception(op_error.error), c10::Error);
}

TEST(DeviceThreadTest, KeepsWorkingAfterException) {
  DeviceThread thread(kCpu);
  thread.submit(make_task([]() -> Batch {
    TORCH_CHECK_VALUE(false, "first task fails");
    return Batch(torch::Tensor());
  }));
  thread.submit(make_task([] { return Batch(torch::tensor(7)); }));

  Completion failed = thread.take();
  EXPECT_TRUE(failed.error);
  Completion succeeded = thread.take();
  EXPECT_FALSE(succeeded.error);
  ASSERT_TRUE(succeeded.batch.has_value());
  EXPECT_EQ(succeeded.batch->tensor().item<int64_t>(), 7);

  // Also after the failure was taken.
  thread.submit(make_task([] { return Batch(torch::tensor(8)); }));
  Completion later = thread.take();
  ASSERT_TRUE(later.batch.has_value());
  EXPECT_EQ(later.batch->tensor().item<int64_t>(), 8);
}

TEST(DeviceThreadTest, TasksRunInSubmissionOrder) {
  DeviceThread thread(kCpu);
  std::vector<int> order;  // only the thread thread writes, before take() returns
  for (int k = 0; k < 20; ++k) {
    thread.submit(make_task([&order, k] {
      if (k % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      order.push_back(k);
      return Batch(torch::tensor(k));
    }));
  }
  for (int k = 0; k < 20; ++k) {
    Completion done = thread.take();
    ASSERT_TRUE(done.batch.has_value());
    EXPECT_EQ(done.batch->tensor().item<int64_t>(), k);
  }
  std::vector<int> expected(20);
  for (int k = 0; k < 20; ++k) expected[k] = k;
  EXPECT_EQ(order, expected);
}

// Runs one task that reports whether grad mode is on, as torchgpipe's test_grad_mode.
void test_grad_mode(bool grad_mode) {
  torch::AutoGradMode mode(grad_mode);
  DeviceThread thread(kCpu);
  thread.submit(make_task([] {
    torch::Tensor x =
        torch::rand({1}, torch::requires_grad(torch::autograd::GradMode::is_enabled()));
    return Batch(x * 2);
  }));
  Completion done = thread.take();
  ASSERT_FALSE(done.error);
  ASSERT_TRUE(done.batch.has_value());
  EXPECT_EQ((*done.batch)[0].requires_grad(), grad_mode);
}

TEST(DeviceThreadTest, GradModeTrue) { test_grad_mode(true); }
TEST(DeviceThreadTest, GradModeFalse) { test_grad_mode(false); }

TEST(DeviceThreadTest, TasksRunUnderTheirSubmittersGradMode) {
  // One thread, tasks captured under alternating modes: no mode leaks from one task to the next.
  DeviceThread thread(kCpu);
  auto detect = [] {
    return Batch(torch::tensor(torch::autograd::GradMode::is_enabled() ? 1 : 0));
  };
  std::vector<bool> modes{false, true, false, false, true};
  for (bool mode : modes) {
    torch::AutoGradMode guard(mode);
    thread.submit(make_task(detect));
  }
  for (bool mode : modes) {
    Completion done = thread.take();
    ASSERT_TRUE(done.batch.has_value());
    EXPECT_EQ(done.batch->tensor().item<int64_t>(), mode ? 1 : 0);
  }
  // The caller's mode is untouched.
  EXPECT_TRUE(torch::autograd::GradMode::is_enabled());
}

TEST(DeviceThreadTest, TasksRunUnderTheirSubmittersInferenceMode) {
  DeviceThread thread(kCpu);
  {
    c10::InferenceMode inference;
    thread.submit(
        make_task([] { return Batch(torch::tensor(c10::InferenceMode::is_enabled() ? 1 : 0)); }));
  }
  thread.submit(
      make_task([] { return Batch(torch::tensor(c10::InferenceMode::is_enabled() ? 1 : 0)); }));
  Completion inside = thread.take();
  Completion outside = thread.take();
  ASSERT_TRUE(inside.batch.has_value());
  ASSERT_TRUE(outside.batch.has_value());
  EXPECT_EQ(inside.batch->tensor().item<int64_t>(), 1);
  EXPECT_EQ(outside.batch->tensor().item<int64_t>(), 0);
}

TEST(DeviceThreadTest, Device) {
  // torchgpipe's test_worker_per_device checks that spawn_threads shares one thread per device;
  // here a thread knows its (normalized) device.
  DeviceThread cpu(kCpu);
  EXPECT_EQ(cpu.device(), kCpu);
  DeviceThread cpu0(c10::Device(c10::kCPU, 0));
  EXPECT_EQ(cpu0.device(), kCpu);
}

TEST(DeviceThreadTest, TaskRunsOnItsStream_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  const c10::Device cuda(c10::kCUDA, 0);
  DeviceThread thread(c10::Device(c10::kCUDA));
  EXPECT_EQ(thread.device(), cuda);

  Task task = make_task([] {
    c10::Stream stream = detail::current_stream(c10::Device(c10::kCUDA));
    return Batch(torch::tensor(static_cast<int64_t>(stream.id())));
  });
  task.stream = detail::new_stream(cuda);
  const c10::Stream expected = task.stream;
  thread.submit(std::move(task));
  Completion done = thread.take();
  ASSERT_TRUE(done.batch.has_value());
  EXPECT_EQ(done.batch->tensor().item<int64_t>(), static_cast<int64_t>(expected.id()));
  // The submitting thread's current stream is unchanged.
  EXPECT_NE(detail::current_stream(cuda), expected);
}

}  // namespace
}  // namespace device_thread_test
}  // namespace gpipe

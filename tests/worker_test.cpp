// Ports torchgpipe's tests/test_worker.py, plus the C++ worker's exception and state handling.
#include "test_util.h"

#include "detail/stream.h"
#include "detail/worker.h"

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
namespace {

using detail::Completion;
using detail::Task;
using detail::Worker;

const c10::Device kCpu(c10::kCPU);

// The calling thread's state, for Task::caller.
std::shared_ptr<const at::ThreadLocalState> here() {
  return std::make_shared<const at::ThreadLocalState>();
}

Task make_task(std::function<Batch()> compute) {
  Task task;
  task.compute = std::move(compute);
  task.caller = here();
  return task;
}

std::vector<std::unique_ptr<Worker>> spawn_workers(size_t count) {
  std::vector<std::unique_ptr<Worker>> workers;
  for (size_t k = 0; k < count; ++k) workers.push_back(std::make_unique<Worker>(kCpu));
  return workers;
}

TEST(WorkerTest, JoinRunningWorkers) {
  std::atomic<int> count{0};
  auto counter = [&count] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ++count;
    return Batch(std::vector<torch::Tensor>{});
  };

  {
    auto workers = spawn_workers(10);
    for (auto& worker : workers) worker->submit(make_task(counter));
  }

  // No nondeterminism: destroying a worker runs what was submitted, then joins.
  EXPECT_EQ(count.load(), 10);
}

struct ExpectedException : std::runtime_error {
  ExpectedException() : std::runtime_error("expected") {}
};

TEST(WorkerTest, JoinRunningWorkersWithException) {
  std::atomic<int> count{0};
  auto counter = [&count] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ++count;
    return Batch(std::vector<torch::Tensor>{});
  };

  EXPECT_THROW(
      {
        auto workers = spawn_workers(10);
        for (auto& worker : workers) worker->submit(make_task(counter));
        throw ExpectedException();
      },
      ExpectedException);

  EXPECT_EQ(count.load(), 10);
}

TEST(WorkerTest, ComputeMultithreading) {
  // Task::compute runs on the workers' threads, one per worker.
  std::mutex mutex;
  std::set<std::thread::id> thread_ids;
  auto log_thread_id = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    thread_ids.insert(std::this_thread::get_id());
    return Batch(std::vector<torch::Tensor>{});
  };

  auto workers = spawn_workers(2);
  for (auto& worker : workers) worker->submit(make_task(log_thread_id));
  for (auto& worker : workers) worker->take();

  EXPECT_EQ(thread_ids.size(), 2u);
  EXPECT_EQ(thread_ids.count(std::this_thread::get_id()), 0u);
}

TEST(WorkerTest, ComputeRunsConcurrently) {
  // Two workers each sleep 300 ms; together they finish well before 600 ms.
  auto workers = spawn_workers(2);
  auto sleep = [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return Batch(std::vector<torch::Tensor>{});
  };
  const auto start = std::chrono::steady_clock::now();
  for (auto& worker : workers) worker->submit(make_task(sleep));
  for (auto& worker : workers) worker->take();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::milliseconds(550));
}

TEST(WorkerTest, ComputeSuccess) {
  Worker worker(kCpu);
  int finalized = 0;
  Task task = make_task([] { return Batch(torch::tensor(42)); });
  task.finalize = [&finalized](Batch&) { ++finalized; };
  worker.submit(std::move(task));

  Completion done = worker.take();

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

TEST(WorkerTest, ComputeException) {
  Worker worker(kCpu);
  worker.submit(make_task([]() -> Batch { throw std::domain_error("zero division"); }));

  Completion done = worker.take();

  EXPECT_FALSE(done.batch.has_value());
  ASSERT_TRUE(done.error);
  EXPECT_THROW(std::rethrow_exception(done.error), std::domain_error);
}

TEST(WorkerTest, ComputeExceptionKeepsType) {
  Worker worker(kCpu);
  worker.submit(make_task([]() -> Batch {
    TORCH_CHECK_VALUE(false, "bad value: ", 7);
    return Batch(torch::Tensor());
  }));
  worker.submit(make_task([]() -> Batch {
    TORCH_CHECK_INDEX(false, "bad index");
    return Batch(torch::Tensor());
  }));
  worker.submit(make_task([] {
    // A torch error raised by an operator on the worker.
    return Batch(torch::mm(torch::ones({2, 3}), torch::ones({2, 3})));
  }));

  Completion value_error = worker.take();
  ASSERT_TRUE(value_error.error);
  GPIPE_EXPECT_THROW_WITH(std::rethrow_exception(value_error.error), c10::ValueError,
                          "bad value: 7");

  Completion index_error = worker.take();
  ASSERT_TRUE(index_error.error);
  GPIPE_EXPECT_THROW_WITH(std::rethrow_exception(index_error.error), c10::IndexError, "bad index");

  Completion op_error = worker.take();
  ASSERT_TRUE(op_error.error);
  EXPECT_THROW(std::rethrow_exception(op_error.error), c10::Error);
}

TEST(WorkerTest, WorkerKeepsWorkingAfterException) {
  Worker worker(kCpu);
  worker.submit(make_task([]() -> Batch {
    TORCH_CHECK_VALUE(false, "first task fails");
    return Batch(torch::Tensor());
  }));
  worker.submit(make_task([] { return Batch(torch::tensor(7)); }));

  Completion failed = worker.take();
  EXPECT_TRUE(failed.error);
  Completion succeeded = worker.take();
  EXPECT_FALSE(succeeded.error);
  ASSERT_TRUE(succeeded.batch.has_value());
  EXPECT_EQ(succeeded.batch->tensor().item<int64_t>(), 7);

  // Also after the failure was taken.
  worker.submit(make_task([] { return Batch(torch::tensor(8)); }));
  Completion later = worker.take();
  ASSERT_TRUE(later.batch.has_value());
  EXPECT_EQ(later.batch->tensor().item<int64_t>(), 8);
}

TEST(WorkerTest, TasksRunInSubmissionOrder) {
  Worker worker(kCpu);
  std::vector<int> order;  // only the worker thread writes, before take() returns
  for (int k = 0; k < 20; ++k) {
    worker.submit(make_task([&order, k] {
      if (k % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      order.push_back(k);
      return Batch(torch::tensor(k));
    }));
  }
  for (int k = 0; k < 20; ++k) {
    Completion done = worker.take();
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
  Worker worker(kCpu);
  worker.submit(make_task([] {
    torch::Tensor x =
        torch::rand({1}, torch::requires_grad(torch::autograd::GradMode::is_enabled()));
    return Batch(x * 2);
  }));
  Completion done = worker.take();
  ASSERT_FALSE(done.error);
  ASSERT_TRUE(done.batch.has_value());
  EXPECT_EQ((*done.batch)[0].requires_grad(), grad_mode);
}

TEST(WorkerTest, GradModeTrue) { test_grad_mode(true); }
TEST(WorkerTest, GradModeFalse) { test_grad_mode(false); }

TEST(WorkerTest, TasksRunUnderTheirSubmittersGradMode) {
  // One worker, tasks captured under alternating modes: no mode leaks from one task to the next.
  Worker worker(kCpu);
  auto detect = [] {
    return Batch(torch::tensor(torch::autograd::GradMode::is_enabled() ? 1 : 0));
  };
  std::vector<bool> modes{false, true, false, false, true};
  for (bool mode : modes) {
    torch::AutoGradMode guard(mode);
    worker.submit(make_task(detect));
  }
  for (bool mode : modes) {
    Completion done = worker.take();
    ASSERT_TRUE(done.batch.has_value());
    EXPECT_EQ(done.batch->tensor().item<int64_t>(), mode ? 1 : 0);
  }
  // The caller's mode is untouched.
  EXPECT_TRUE(torch::autograd::GradMode::is_enabled());
}

TEST(WorkerTest, TasksRunUnderTheirSubmittersInferenceMode) {
  Worker worker(kCpu);
  {
    c10::InferenceMode inference;
    worker.submit(
        make_task([] { return Batch(torch::tensor(c10::InferenceMode::is_enabled() ? 1 : 0)); }));
  }
  worker.submit(
      make_task([] { return Batch(torch::tensor(c10::InferenceMode::is_enabled() ? 1 : 0)); }));
  Completion inside = worker.take();
  Completion outside = worker.take();
  ASSERT_TRUE(inside.batch.has_value());
  ASSERT_TRUE(outside.batch.has_value());
  EXPECT_EQ(inside.batch->tensor().item<int64_t>(), 1);
  EXPECT_EQ(outside.batch->tensor().item<int64_t>(), 0);
}

TEST(WorkerTest, WorkerDevice) {
  // torchgpipe's test_worker_per_device checks that spawn_workers shares one worker per device;
  // here a worker knows its (normalized) device.
  Worker cpu(kCpu);
  EXPECT_EQ(cpu.device(), kCpu);
  Worker cpu0(c10::Device(c10::kCPU, 0));
  EXPECT_EQ(cpu0.device(), kCpu);
}

TEST(WorkerTest, TaskRunsOnItsStream_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  const c10::Device cuda(c10::kCUDA, 0);
  Worker worker(c10::Device(c10::kCUDA));
  EXPECT_EQ(worker.device(), cuda);

  Task task = make_task([] {
    c10::Stream stream = detail::current_stream(c10::Device(c10::kCUDA));
    return Batch(torch::tensor(static_cast<int64_t>(stream.id())));
  });
  task.stream = detail::new_stream(cuda);
  const c10::Stream expected = task.stream;
  worker.submit(std::move(task));
  Completion done = worker.take();
  ASSERT_TRUE(done.batch.has_value());
  EXPECT_EQ(done.batch->tensor().item<int64_t>(), static_cast<int64_t>(expected.id()));
  // The submitting thread's current stream is unchanged.
  EXPECT_NE(detail::current_stream(cuda), expected);
}

}  // namespace
}  // namespace gpipe

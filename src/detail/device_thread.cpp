#include "detail/device_thread.h"

#include "detail/stream.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace gpipe {
namespace detail {
namespace {

// An unbounded FIFO for one producer and one consumer.
template <typename T>
class Queue {
 public:
  void push(T value) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(std::move(value));
    }
    ready_.notify_one();
  }

  T pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [this] { return !items_.empty(); });
    T value = std::move(items_.front());
    items_.pop_front();
    return value;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;  // guarded by mutex_
};

}  // namespace

struct DeviceThread::Queues {
  Queue<Task> in;  // a Task without compute stops the thread
  Queue<Completion> out;
};

DeviceThread::DeviceThread(c10::Device device)
    : device_(normalize_device(device)), queues_(std::make_unique<Queues>()) {
  thread_ = std::make_unique<std::thread>([this] { run(); });
}

DeviceThread::~DeviceThread() {
  queues_->in.push(Task{});
  thread_->join();
}

void DeviceThread::submit(Task task) {
  TORCH_INTERNAL_ASSERT(task.compute && task.caller);
  queues_->in.push(std::move(task));
}

Completion DeviceThread::take() { return queues_->out.pop(); }

Completion execute(Task task) {
  Completion done{std::move(task), c10::nullopt, nullptr};
  try {
    UseCallerState caller_state(*done.task.caller);
    UseStream use_stream(done.task.stream);
    done.batch = done.task.compute();
  } catch (...) {
    done.error = std::current_exception();
  }
  return done;
}

void DeviceThread::run() {
  c10::OptionalDeviceGuard device_guard;
  if (!device_.is_cpu()) device_guard.reset_device(device_);
  while (true) {
    Task task = queues_->in.pop();
    if (!task.compute) return;
    queues_->out.push(execute(std::move(task)));
  }
}

}  // namespace detail
}  // namespace gpipe

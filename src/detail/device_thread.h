// Device threads: one thread per device that computes GPipe's tasks in the order they are
// submitted (torchgpipe's "workers"; in gpipe a worker is a row of a schedule, see the README's
// glossary).
//
// Only accelerators get a device thread: their kernels run asynchronously, so a thread per device
// keeps every device fed. CPU kernels run synchronously on whichever thread calls them, so the
// pipeline's driving thread computes CPU tasks itself with execute(): a CPU device thread would
// only add two thread hand-offs per task and no parallelism (torchgpipe's shared CPU worker ran
// them one after another too).
//
// Thread safety: submit() and take() are called by one driving thread (the pipeline's); the
// device thread only runs Task::compute. A task runs under the thread-local state of the thread
// that submitted it (grad mode, inference mode, autocast, ...), captured in Task::caller.
// Exceptions never escape the device thread: they come back from take() as Completion::error.
#pragma once

#include "detail/caller_state.h"
#include "gpipe/microbatch.h"

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/Optional.h>

#include <exception>
#include <functional>
#include <memory>
#include <thread>

namespace gpipe {
namespace detail {

/// How to compute one micro-batch on one partition. `compute` runs on the device thread with
/// `stream` current; `finalize`, if set, runs on the driving thread once compute has succeeded.
struct Task {
  c10::Stream stream{c10::Stream::DEFAULT, c10::Device(c10::kCPU)};
  std::function<Batch()> compute;
  std::function<void(Batch&)> finalize;
  std::shared_ptr<const CallerState> caller;
};

/// The outcome of one task: its batch, or the exception it threw.
struct Completion {
  Task task;
  c10::optional<Batch> batch;
  std::exception_ptr error;
};

/// Runs `task` on the calling thread as a device thread would: under task.caller's state
/// (caller_state.h) with task.stream current, catching any exception into the completion.
Completion execute(Task task);

/// One thread bound to one device.
class DeviceThread {
 public:
  explicit DeviceThread(c10::Device device);
  /// Runs what was submitted to the end, then joins the thread.
  ~DeviceThread();
  DeviceThread(const DeviceThread&) = delete;
  DeviceThread& operator=(const DeviceThread&) = delete;

  c10::Device device() const { return device_; }

  /// Queues `task`. REQUIRES: task.compute and task.caller are set.
  void submit(Task task);

  /// Blocks until the oldest task not yet taken completes, and returns it.
  Completion take();

 private:
  struct Queues;
  void run();

  c10::Device device_;
  std::unique_ptr<Queues> queues_;
  std::unique_ptr<std::thread> thread_;
};

}  // namespace detail
}  // namespace gpipe

#include "pipeline/pipeline.h"

#include "detail/copy.h"
#include "detail/dependency.h"
#include "detail/stream.h"
#include "pipeline/cell_task.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>

#include <utility>

namespace gpipe {
namespace detail {
namespace {

// Backward of `fork_from` runs after backward of `join_to`.
void depend(Batch& fork_from, Batch& join_to) {
  auto [tensor, phony] = fork(fork_from[0]);
  fork_from[0] = std::move(tensor);
  join_to[0] = join(join_to[0], phony);
}

bool both_cpu(const c10::Stream& a, const c10::Stream& b) { return is_cpu(a) && is_cpu(b); }

// Runs the tasks in order on this thread. After a failure the rest would be thrown away: they
// are skipped, each completing with that failure.
std::deque<Completion> execute_in_order(std::vector<Task> tasks) {
  std::deque<Completion> done;
  for (auto& task : tasks) {
    const bool failed = !done.empty() && done.back().error;
    done.push_back(failed ? Completion{std::move(task), c10::nullopt, done.back().error}
                          : execute(std::move(task)));
  }
  return done;
}

}  // namespace

Pipeline::Pipeline(std::vector<Batch>& batches, std::vector<torch::nn::Sequential>& partitions,
                   std::vector<c10::Device> devices,
                   std::vector<std::vector<c10::Stream>> copy_streams,
                   std::vector<DeviceThread*> threads, size_t checkpoint_stop,
                   std::shared_ptr<const skip::SkipLayout> skip_layout,
                   std::shared_ptr<trace::Tracer> tracer, int64_t step)
    : batches_(batches),
      partitions_(partitions),
      devices_(std::move(devices)),
      copy_streams_(std::move(copy_streams)),
      device_threads_(std::move(threads)),
      checkpoint_stop_(checkpoint_stop),
      skip_layout_(std::move(skip_layout)),
      caller_(std::make_shared<CallerState>()),
      tracer_(std::move(tracer)),
      step_(step) {
  for (const auto& device : devices_) compute_streams_.push_back(current_stream(device));
  if (skip_layout_ && !skip_layout_->empty()) {
    for (size_t i = 0; i < batches_.size(); ++i) {
      skip_trackers_.push_back(std::make_shared<skip::SkipTrackerThroughPortals>(skip_layout_));
    }
  }
}

void Pipeline::run() {
  for (const auto& clock : clock_cycles(batches_.size(), partitions_.size())) {
    fence(clock);
    compute(clock);
  }
}

void Pipeline::fence(const std::vector<Cell>& clock) {
  for (const auto& [i, j] : clock) {
    // Micro-batch i-1 is differentiated after micro-batch i.
    if (i != 0) depend(batches_[i - 1], batches_[i]);
    const auto& next = copy_streams_[j][i];
    // Skip tensors come straight from the partition that stashed them.
    if (!skip_trackers_.empty()) {
      for (const auto& route : skip_layout_->copy_policy(j)) {
        const auto& prev = copy_streams_[route.stash_stage][i];
        if (!both_cpu(prev, next)) skip_trackers_[i]->copy(batches_[i], prev, next, route.key);
      }
    }
    if (j != 0) {
      const auto& prev = copy_streams_[j - 1][i];
      if (!both_cpu(prev, next)) batches_[i].set_tensors(copy(batches_[i].tensors(), prev, next));
    }
  }
}

void Pipeline::compute(const std::vector<Cell>& clock) {
  std::vector<Task> here;  // tasks of partitions without a device thread
  // The backward of each task of the clock, in clock order, when traced.
  std::vector<std::shared_ptr<BackwardSpan>> backward_spans;
  const bool trace_backward = tracer_ && at::GradMode::is_enabled();

  for (const auto& cell : clock) {
    const auto [i, j] = cell;
    wait_for_copy(cell);
    if (trace_backward) {
      backward_spans.push_back(std::make_shared<BackwardSpan>(tracer_, static_cast<int64_t>(j),
                                                              static_cast<int64_t>(i), step_));
      backward_spans.back()->watch_input(batches_[i]);
    }
    CellWork work;
    work.partition = partitions_[j];
    if (!skip_trackers_.empty()) work.skips = skip_trackers_[i];
    work.tracer = tracer_;
    work.step = step_;
    work.checkpoint = i < checkpoint_stop_;
    Task task = cell_task(cell, batches_[i], std::move(work));
    task.stream = compute_streams_[j];
    task.caller = caller_;
    // [2] Compute on the partition's device thread, in parallel with the other partitions; CPU
    // tasks wait until every device thread has its task.
    if (device_threads_[j] != nullptr) {
      device_threads_[j]->submit(std::move(task));
    } else {
      here.push_back(std::move(task));
    }
  }
  collect(clock, execute_in_order(std::move(here)), backward_spans);
}

void Pipeline::wait_for_copy(const Cell& cell) {
  const auto [i, j] = cell;
  const auto& copied = copy_streams_[j][i];
  if (j != 0 && !both_cpu(copied, compute_streams_[j])) {
    batches_[i].set_tensors(wait(batches_[i].tensors(), copied, compute_streams_[j]));
  }
}

void Pipeline::collect(const std::vector<Cell>& clock, std::deque<Completion> here,
                       const std::vector<std::shared_ptr<BackwardSpan>>& backward_spans) {
  const size_t n = partitions_.size();
  std::exception_ptr error;
  for (size_t k = 0; k < clock.size(); ++k) {
    const auto [i, j] = clock[k];
    Completion done;
    if (device_threads_[j] != nullptr) {
      done = device_threads_[j]->take();
    } else {
      done = std::move(here.front());
      here.pop_front();
    }
    // Hold the first exception; drain the rest of the clock so no task is left running.
    if (error) continue;
    if (done.error) {
      error = done.error;
      continue;
    }
    Batch& batch = *done.batch;
    // [3] The next copy stream waits for the output.
    const auto& stream = compute_streams_[j];
    if (j != n - 1 && !both_cpu(stream, copy_streams_[j][i])) {
      batch.set_tensors(wait(batch.tensors(), stream, copy_streams_[j][i]));
    }
    // [4] Schedule the recomputation, if checkpointed.
    if (done.task.finalize) {
      c10::OptionalDeviceGuard device_guard;
      if (!devices_[j].is_cpu()) device_guard.reset_device(devices_[j]);
      UseStream use_stream(stream);
      done.task.finalize(batch);
    }
    if (!backward_spans.empty()) backward_spans[k]->watch_output(batch);
    batches_[i] = std::move(batch);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace detail
}  // namespace gpipe

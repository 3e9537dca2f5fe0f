#include "detail/pipeline.h"

#include "detail/backward_span.h"
#include "detail/copy.h"
#include "detail/dependency.h"
#include "detail/stream.h"
#include "gpipe/checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <deque>

namespace gpipe {

std::ostream& operator<<(std::ostream& out, const Cell& cell) {
  return out << "(" << cell.microbatch << "," << cell.partition << ")";
}

std::vector<std::vector<Cell>> clock_cycles(size_t m, size_t n) {
  std::vector<std::vector<Cell>> clocks;
  if (m == 0 || n == 0) return clocks;
  for (size_t k = 0; k < m + n - 1; ++k) {
    std::vector<Cell> clock;
    for (size_t j = k + 1 > m ? k + 1 - m : 0; j < std::min(k + 1, n); ++j)
      clock.push_back({k - j, j});
    clocks.push_back(std::move(clock));
  }
  return clocks;
}

namespace detail {
namespace {

// Backward of `fork_from` runs after backward of `join_to`.
void depend(Batch& fork_from, Batch& join_to) {
  auto [tensor, phony] = fork(fork_from[0]);
  fork_from[0] = std::move(tensor);
  join_to[0] = join(join_to[0], phony);
}

bool both_cpu(const c10::Stream& a, const c10::Stream& b) { return is_cpu(a) && is_cpu(b); }

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
  const size_t n = partitions_.size();
  std::vector<Task> here;  // tasks of partitions without a device thread
  // The backward of each task of the clock, in clock order, when traced.
  std::vector<std::shared_ptr<BackwardSpan>> backward_spans;
  const bool trace_backward = tracer_ && at::GradMode::is_enabled();

  for (const auto& [i, j] : clock) {
    Batch& batch = batches_[i];
    const auto& stream = compute_streams_[j];
    // [1] Synchronize with the copied input.
    if (j != 0 && !both_cpu(copy_streams_[j][i], stream)) {
      batch.set_tensors(wait(batch.tensors(), copy_streams_[j][i], stream));
    }

    if (trace_backward) {
      backward_spans.push_back(std::make_shared<BackwardSpan>(tracer_, static_cast<int64_t>(j),
                                                              static_cast<int64_t>(i), step_));
      backward_spans.back()->watch_input(batch);
    }

    Task task;
    task.stream = stream;
    task.caller = caller_;
    // The recomputation runs in backward, which may come after the GPipe is gone: the
    // function holds its partition (a Sequential's layers stay alive with it), not a reference.
    torch::nn::Sequential partition = partitions_[j];
    const std::string what = "partition " + std::to_string(j);
    BatchFunction function;
    if (skip_trackers_.empty()) {
      function = [partition, what](const Batch& input) mutable {
        return input.call(partition, what);
      };
    } else {
      function = [partition, what, j, tracker = skip_trackers_[i]](const Batch& input) mutable {
        return skip::detail::call_with_skips(input, partition, j, tracker, what);
      };
    }
    // On whichever thread runs it (a device thread, the caller, or autograd's for a recomputation),
    // partition j's computation of micro-batch i is a span on row j: in the tracer, if any, and
    // for a profiler (trace.h).
    function = [function = std::move(function), tracer = tracer_, i, j,
                step = step_](const Batch& input) {
      trace::UseTracer use_tracer(tracer.get(), static_cast<int64_t>(j), step);
      trace::TraceSpan span(is_recomputing() ? "recompute" : "forward", static_cast<int64_t>(j),
                            static_cast<int64_t>(i));
      return function(input);
    };
    if (i < checkpoint_stop_) {
      auto checkpointing = std::make_shared<Checkpointing>(std::move(function), batch);
      task.compute = [checkpointing] { return checkpointing->checkpoint(); };
      task.finalize = [checkpointing](Batch& output) { checkpointing->recompute(output); };
    } else {
      task.compute = [function = std::move(function), batch] { return function(batch); };
    }
    // [2] Compute on the partition's device thread, in parallel with the other partitions; CPU
    // tasks wait until every device thread has its task.
    if (device_threads_[j] != nullptr) {
      device_threads_[j]->submit(std::move(task));
    } else {
      here.push_back(std::move(task));
    }
  }
  // CPU tasks, in clock order. After a failure the rest would be thrown away: skip them.
  std::deque<Completion> done_here;
  for (auto& task : here) {
    const bool failed = !done_here.empty() && done_here.back().error;
    done_here.push_back(failed ? Completion{std::move(task), c10::nullopt, done_here.back().error}
                               : execute(std::move(task)));
  }

  std::exception_ptr error;
  size_t position = 0;  // in the clock
  for (const auto& [i, j] : clock) {
    const size_t k = position++;
    Completion done;
    if (device_threads_[j] != nullptr) {
      done = device_threads_[j]->take();
    } else {
      done = std::move(done_here.front());
      done_here.pop_front();
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
    if (trace_backward) backward_spans[k]->watch_output(batch);
    batches_[i] = std::move(batch);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace detail
}  // namespace gpipe

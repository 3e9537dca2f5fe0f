// The pipeline: runs micro-batches through partitions in GPipe's clock-cycle schedule.
//
// At clock k, micro-batch i runs on partition j for every i + j == k. Each clock has two phases:
// the fence, on the driving thread, adds the backward-order dependency between neighbouring
// micro-batches and copies each micro-batch to its next device; the compute phase hands each
// (i, j) to partition j's device thread (CPU partitions: computes it on the driving thread) and, as
// results come back in order, finalizes them. With
// checkpointing, the autograd graph of one (i, j) looks like this:
//
//       ┌─────┸──────┐
//       │    Copy    │                  (fence: to partition j's device)
//       └─────┰──────┘
//     ─ ─ ─ ─ ╂ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─
//       ┌─────┸──────┐                  (compute)
//       │    Wait    │ [1] partition j's compute stream waits for the copy stream.
//       └─────┰──────┘
//       ┌─────┸──────┐
//       │ Checkpoint │ [2] partition j runs on its device thread, checkpointed.
//       └─────┰──────┘
//       ┌─────┸──────┐
//       │    Wait    │ [3] the next copy stream waits for the compute stream.
//       └─────┰──────┘
//             ┠ ─ ─ ─ ┐
//             ┃ ┌─────┴─────┐
//             ┃ │ Recompute │ [4] the recomputation, scheduled to run first in backward.
//             ┃ └─────┬─────┘
//             ┠ ─ ─ ─ ┘
//     ─ ─ ─ ─ ╂ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─ ─
//       ┌─────┸──────┐                  (fence: to partition j+1's device)
//       │    Copy    │
//       └─────┰──────┘
//
// Without checkpointing, [2] is a plain call and [4] is absent. Between CPU partitions Copy and
// Wait have nothing to do and are left out. Skip connections between partitions travel beside
// this lane through portals (skip/portal.h): hidden after [2] of the stashing partition, copied at
// the fence of the popping one, taken out before its [2].
//
// The parts: clock_cycles.h (which cells run at each clock), cell_task.h (what a cell computes),
// this file (the driver: the fence, handing out the tasks, collecting their results).
//
// Thread safety: Pipeline::run is called by one thread, which owns the batches; tasks run on the
// device threads given.
#pragma once

#include "detail/backward_span.h"
#include "detail/device_thread.h"
#include "gpipe/microbatch.h"
#include "gpipe/skip/layout.h"
#include "gpipe/skip/tracker.h"
#include "gpipe/trace.h"
#include "pipeline/clock_cycles.h"

#include <c10/core/Stream.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

namespace gpipe {

namespace detail {

/// One run of the pipeline over `batches`, which it replaces in place with the outputs.
/// Tasks of partitions without a device thread (CPU ones) run on the calling thread.
class Pipeline {
 public:
  /// `copy_streams[j][i]` is the stream that micro-batch i arrives on at partition j;
  /// `threads[j]` computes partition j, or the calling thread where it is null. Micro-batches
  /// i < checkpoint_stop are checkpointed. Skips follow `skip_layout` (none if null or empty).
  /// Each partition's forwards and recomputations are trace spans (trace.h), recorded in
  /// `tracer`, if any, as `step`.
  Pipeline(std::vector<Batch>& batches, std::vector<torch::nn::Sequential>& partitions,
           std::vector<c10::Device> devices, std::vector<std::vector<c10::Stream>> copy_streams,
           std::vector<DeviceThread*> threads, size_t checkpoint_stop,
           std::shared_ptr<const skip::SkipLayout> skip_layout = nullptr,
           std::shared_ptr<trace::Tracer> tracer = nullptr, int64_t step = 0);

  /// Runs every clock. The first exception of any task is rethrown once the tasks of its clock
  /// have finished; later clocks do not run.
  void run();

 private:
  // The clock's phases (see the file comment).
  void fence(const std::vector<Cell>& clock);
  void compute(const std::vector<Cell>& clock);
  // [1]: the cell's input, once its copy has arrived, on the partition's compute stream.
  void wait_for_copy(const Cell& cell);
  // [3] and [4] for each cell's result, in clock order; rethrows the clock's first exception
  // once every task of the clock is done. `here` holds the completions of the cells computed
  // on this thread, in clock order.
  void collect(const std::vector<Cell>& clock, std::deque<Completion> here,
               const std::vector<std::shared_ptr<BackwardSpan>>& backward_spans);

  std::vector<Batch>& batches_;
  std::vector<torch::nn::Sequential>& partitions_;
  std::vector<c10::Device> devices_;
  std::vector<std::vector<c10::Stream>> copy_streams_;
  std::vector<c10::Stream> compute_streams_;
  std::vector<DeviceThread*> device_threads_;
  size_t checkpoint_stop_;
  std::shared_ptr<const skip::SkipLayout> skip_layout_;
  // One per micro-batch when the model has skips, else empty.
  std::vector<std::shared_ptr<skip::SkipTrackerThroughPortals>> skip_trackers_;
  std::shared_ptr<const CallerState> caller_;
  std::shared_ptr<trace::Tracer> tracer_;
  int64_t step_;
};

}  // namespace detail
}  // namespace gpipe

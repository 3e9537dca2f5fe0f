// What one clock cell computes: partition j's forward of micro-batch i as a device thread's Task
// ([2] in pipeline.h, and the recomputation [4] when checkpointed).
//
// Thread safety: the Task runs on one device thread (or the driving thread); its recomputation,
// if any, later on autograd's.
#pragma once

#include "detail/device_thread.h"
#include "gpipe/microbatch.h"
#include "gpipe/skip/tracker.h"
#include "gpipe/trace.h"
#include "pipeline/clock_cycles.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <memory>

namespace gpipe {
namespace detail {

/// How a cell's partition runs.
struct CellWork {
  /// The cell's partition. The task holds it, not a reference: the recomputation runs in
  /// backward, which may come after the GPipe is gone.
  torch::nn::Sequential partition;
  /// The micro-batch's tracker when the model has skips between partitions, else null.
  std::shared_ptr<skip::SkipTrackerThroughPortals> skips;
  /// Where the forward and recomputation spans go, if anywhere, as `step`.
  std::shared_ptr<trace::Tracer> tracer;
  int64_t step = 0;
  /// Whether the micro-batch is checkpointed.
  bool checkpoint = false;
};

/// The task of `cell` on `input`: Task::compute runs the partition (checkpointed or not) as a
/// trace span on the partition's row; Task::finalize, for a checkpointed cell, schedules the
/// recomputation. Task::stream and Task::caller are the caller's to set.
Task cell_task(const Cell& cell, const Batch& input, CellWork work);

}  // namespace detail
}  // namespace gpipe

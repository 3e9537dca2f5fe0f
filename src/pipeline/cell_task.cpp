#include "pipeline/cell_task.h"

#include "detail/checkpointing.h"
#include "gpipe/checkpoint.h"

#include <string>
#include <utility>

namespace gpipe {
namespace detail {
namespace {

// Runs `partition` on `input` with `tracker` current, between the tracker's open() and close():
// the tensors popped from other partitions come out of their portals before its first layer,
// and what it stashed for them goes in after its last.
Batch call_through_portals(const Batch& input, torch::nn::Sequential& partition, size_t index,
                           const std::shared_ptr<skip::SkipTrackerThroughPortals>& tracker,
                           const std::string& what) {
  skip::UseSkipTracker use(tracker);
  Batch batch = input;
  tracker->open(batch, index);
  Batch output = batch.call(partition, what);
  tracker->close(output, index);
  return output;
}

}  // namespace

Task cell_task(const Cell& cell, const Batch& input, CellWork work) {
  const size_t i = cell.microbatch;
  const size_t j = cell.partition;
  const std::string what = "partition " + std::to_string(j);
  BatchFunction function;
  if (!work.skips) {
    function = [partition = work.partition, what](const Batch& batch) mutable {
      return batch.call(partition, what);
    };
  } else {
    function = [partition = work.partition, what, j, tracker = work.skips](
                   const Batch& batch) mutable {
      return call_through_portals(batch, partition, j, tracker, what);
    };
  }
  // On whichever thread runs it (a device thread, the caller, or autograd's for a recomputation),
  // the cell is a span on row j: in the tracer, if any, and for a profiler (trace.h).
  function = [function = std::move(function), tracer = work.tracer, i, j,
              step = work.step](const Batch& batch) {
    trace::UseTracer use_tracer(tracer.get(), static_cast<int64_t>(j), step);
    trace::TraceSpan span(is_recomputing() ? "recompute" : "forward", static_cast<int64_t>(j),
                          static_cast<int64_t>(i));
    return function(batch);
  };

  Task task;
  if (work.checkpoint) {
    auto checkpointing = std::make_shared<Checkpointing>(std::move(function), input);
    task.compute = [checkpointing] { return checkpointing->checkpoint(); };
    task.finalize = [checkpointing](Batch& output) { checkpointing->recompute(output); };
  } else {
    task.compute = [function = std::move(function), input] { return function(input); };
  }
  return task;
}

}  // namespace detail
}  // namespace gpipe

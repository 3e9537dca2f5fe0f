// One order for the zero-bubble schedules of several stages per worker (ZBV, interleaved ZB1P;
// generators.h), which keep it where it beats their other (faster_order.h): a simulation in
// unit-time ticks. In each tick each worker runs the input gradient of
// its oldest ready micro-batch (the critical path), else a forward - the stage nearer the loss
// first - while it holds fewer than limit(w) micro-batches (forwarded, weight gradient not computed
// yet), else its oldest pending weight gradient; the bound lifts only in a tick where nothing else
// could run. A result computed at tick t is usable from tick t + 1; each stage runs its forwards,
// input gradients and weight gradients in micro-batch order.
//
// Internal to the generators. Thread safety: pure function.
#pragma once

#include "gpipe/schedule/action.h"

#include <cstdint>
#include <functional>

namespace gpipe {
namespace schedule {
namespace detail {

/// The schedule of `num_workers` workers with `stages_per_worker` stages each under `placement`
/// and `num_microbatches` micro-batches, worker w holding at most limit(w) micro-batches where
/// it can, with its sends and receives (with_communication). REQUIRES: the counts are checked
/// (generator_checks.h).
Schedule greedy_split_backward(int64_t num_workers, int64_t stages_per_worker,
                               int64_t num_microbatches, Placement placement,
                               const std::function<int64_t(int64_t)>& limit);

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

// Of two orders of the same work, the one a pipeline runs faster. Both generators of a kind can
// be right: an order found by simulating workers with free messages (greedy_split_backward.h)
// packs the warm-up tightest, but in its steady state each action may wait on a message sent
// the moment before, so on a real link every message can land on the critical path; an order
// built phase by phase leaves each message an action's time to arrive. predict() tells which
// to keep.
//
// Internal to the generators. Thread safety: pure function.
#pragma once

#include "gpipe/schedule/action.h"

namespace gpipe {
namespace schedule {
namespace detail {

/// `first`, unless `second` has the shorter predicted step with unit costs (predict.h:
/// ActionCosts::unit) and free messages, or the same step there and the shorter one where each
/// message between workers takes a tenth of an action. REQUIRES: both schedule the same
/// workers, stages and micro-batches.
Schedule faster_order(Schedule first, Schedule second);

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

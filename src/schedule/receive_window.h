// How many receives a rank posts ahead on each edge unless told (PipelineStageOptions::
// receive_window 0): the most micro-batches any stage holds at once under the schedule, so that
// a sender never waits for its receiver to ask. The planner counts the same window's buffers
// (plan.h).
#pragma once

#include "gpipe/schedule/action.h"

#include <cstdint>

namespace gpipe {
namespace schedule {
namespace detail {

/// The most micro-batches a stage of `schedule` holds at once with every action of unit cost;
/// at least 1.
int64_t automatic_receive_window(const Schedule& schedule);

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

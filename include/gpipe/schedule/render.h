// Text rendering of a schedule: one row per worker, one column per round of validate()'s
// simulation, each cell the compute action of that round ("F3" forward and "B3" backward of
// micro-batch 3, or its input-gradient half; "W3" its weight-gradient half; with several stages
// per worker "F3:5" names stage 5) or "." for an idle round.
//
// Example (1F1B, 2 stages, 3 micro-batches):
//   worker 0 | F0 F1 .  B0 F2 B1 .  B2
//   worker 1 | .  F0 B0 F1 B1 F2 B2
//
// Thread safety: pure function.
#pragma once

#include "gpipe/schedule/action.h"

#include <string>

namespace gpipe {
namespace schedule {

/// Renders `schedule` as above, rows ending with '\n'. Throws c10::ValueError where validate()
/// would (with an unbounded queue).
std::string render(const Schedule& schedule);

}  // namespace schedule
}  // namespace gpipe

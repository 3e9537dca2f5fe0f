// What a worker's actions hold, for the tests of schedules that split backwards.
#pragma once

#include "gpipe/schedule/action.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace gpipe {
namespace testing {

/// The most micro-batches `actions` hold at once: forwarded, weight gradient not yet computed.
inline int64_t most_held(const std::vector<schedule::Action>& actions) {
  int64_t held = 0, most = 0;
  for (const schedule::Action& a : actions) {
    if (a.kind == schedule::ActionKind::kForward) most = std::max(most, ++held);
    if (a.kind == schedule::ActionKind::kBackwardWeight) --held;
  }
  return most;
}

}  // namespace testing
}  // namespace gpipe

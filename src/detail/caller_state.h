// The thread-local state of the thread that hands gpipe work - grad mode, inference mode,
// autocast and its dtypes, dispatch keys - which the work then runs under on whichever thread
// runs it, so that a user's recipe keeps its meaning when gpipe moves work to another thread.
//
// at::ThreadLocalState carries autocast's dtypes in LibTorch 2.x, not in 1.13: AutocastState
// carries them for both.
//
// Thread safety: CallerState is captured on one thread and may be read from others.
#pragma once

#include "detail/autocast_state.h"

#include <ATen/ThreadLocalState.h>

namespace gpipe {
namespace detail {

/// The calling thread's state at construction.
struct CallerState {
  at::ThreadLocalState thread_local_state;
  AutocastState autocast = AutocastState::current();
};

/// For a scope, the calling thread runs under `caller` (autocast's cache of casts off, see
/// autocast_state.h), then under its own state again.
class UseCallerState {
 public:
  explicit UseCallerState(const CallerState& caller)
      : thread_local_state_(caller.thread_local_state), autocast_(caller.autocast) {}

 private:
  at::ThreadLocalStateGuard thread_local_state_;
  UseAutocast autocast_;
};

}  // namespace detail
}  // namespace gpipe

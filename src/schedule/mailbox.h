// Mailbox: the messages of one worker's stages between the action that produces each and the one
// that consumes it (run_actions.h). A forward's output waits in it for its send, a received input
// for its forward; gradients likewise on the way back. Between two stages of the same worker (the
// turn of a V) a send puts the message straight into the receiver's slot. The skip lane
// (skip/skippable.h) has slots of its own, one per pair of stages and micro-batch.
//
// Internal to run_actions. Thread safety: one worker's thread.
#pragma once

#include "gpipe/microbatch.h"
#include "gpipe/schedule/action.h"

#include <cstdint>
#include <map>
#include <tuple>

namespace gpipe {
namespace schedule {
namespace detail {

/// Which message of a stage's micro-batch a slot holds.
enum class Slot {
  kInput,           ///< the input of its forward, received
  kOutput,          ///< the output of its forward, to send
  kOutputGradient,  ///< the gradient of its output, received, for its backward
  kInputGradient,   ///< the gradient of its input, from its backward, to send
};

class Mailbox {
 public:
  /// Puts `message` into `slot` of micro-batch `microbatch` of stage `stage`.
  /// REQUIRES: the slot is empty (a valid schedule makes each message once).
  void put(Slot slot, int64_t stage, int64_t microbatch, Batch message);

  /// True if `slot` of micro-batch `microbatch` of stage `stage` holds a message.
  bool holds(Slot slot, int64_t stage, int64_t microbatch) const;

  /// Takes the message out of `slot` of the stage and micro-batch of `action`, which uses it.
  /// Throws c10::Error (an internal assert) naming the action if there is none.
  Batch take(Slot slot, const Action& action);

  /// Puts the skip lane's message from stage `from` to stage `to` for `microbatch`: the tensors
  /// (or gradients) of every route between the two. REQUIRES: none is there yet.
  void put_skips(int64_t from, int64_t to, int64_t microbatch, Batch message);

  /// Takes that message out. Throws c10::Error (an internal assert) if there is none.
  Batch take_skips(int64_t from, int64_t to, int64_t microbatch);

 private:
  std::map<std::tuple<Slot, int64_t, int64_t>, Batch> slots_;     // (slot, stage, micro-batch)
  std::map<std::tuple<int64_t, int64_t, int64_t>, Batch> skips_;  // (from, to, micro-batch)
};

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

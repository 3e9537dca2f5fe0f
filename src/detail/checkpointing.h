// Checkpointing of one call: the machinery behind gpipe::checkpoint() and the engines'
// checkpointed micro-batches.
//
// Checkpointing::checkpoint() runs the function under no-grad inside a Checkpoint autograd node
// (diagram [2] in pipeline/pipeline.h); Checkpointing::recompute() hangs a Recompute node beside
// the output with fork/join (diagram [4]), so that in backward Recompute runs first: it restores
// the random number generators to their state at forward time (so dropout draws the same masks)
// and the forward's autocast settings (amp/autocast.h; backward may run outside autocast), runs
// the function again with grad, and hands the result to Checkpoint, whose backward then
// differentiates it re-entrantly. Neither pass caches autocast's weight casts.
//
// Thread safety: checkpoint() may run on a worker thread and recompute() on another; the two
// nodes then run in backward, ordered by fork/join, so their shared state needs no lock. The
// Enable* scopes set thread-local flags.
#pragma once

#include "gpipe/microbatch.h"

#include <ATen/core/ivalue.h>

#include <utility>

namespace gpipe {
namespace detail {

/// Sets a thread-local flag for a scope, and restores it after.
class FlagScope {
 public:
  explicit FlagScope(bool& flag) : flag_(flag), previous_(std::exchange(flag, true)) {}
  ~FlagScope() { flag_ = previous_; }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;

 private:
  bool& flag_;
  bool previous_;
};

/// Makes is_checkpointing() true on the calling thread for a scope; active() is that flag.
struct EnableCheckpointing : FlagScope {
  EnableCheckpointing();
  static bool active();
};

/// Makes is_recomputing() true on the calling thread for a scope; active() is that flag.
struct EnableRecomputing : FlagScope {
  EnableRecomputing();
  static bool active();
};

/// The state shared by the Checkpoint and Recompute nodes of one micro-batch.
struct CheckpointState;

/// Checkpointing of one call of `function` on `input`.
class Checkpointing {
 public:
  Checkpointing(BatchFunction function, Batch input);
  ~Checkpointing();
  Checkpointing(const Checkpointing&) = delete;
  Checkpointing& operator=(const Checkpointing&) = delete;

  /// Computes the output under a Checkpoint node. [2]
  Batch checkpoint();

  /// Schedules the recomputation before the backward of `output` (what checkpoint() returned),
  /// replacing each of its tensors that requires grad with a joined one. [4]
  void recompute(Batch& output);

 private:
  c10::intrusive_ptr<CheckpointState> state_;
  Batch input_;
};

}  // namespace detail
}  // namespace gpipe

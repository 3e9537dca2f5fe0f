// Checkpointing: compute a partition without keeping its activations, and recompute them just
// before its backward.
//
// Checkpointing::checkpoint() runs the function under no-grad inside a Checkpoint autograd node
// (diagram [2] in src/detail/pipeline.h); Checkpointing::recompute() hangs a Recompute node beside
// the output with fork/join (diagram [4]), so that in backward Recompute runs first: it restores
// the random number generators to their state at forward time (so dropout draws the same masks)
// and the forward's autocast settings (amp/autocast.h; backward may run outside autocast), runs
// the function again with grad, and hands the result to Checkpoint, whose backward then
// differentiates it re-entrantly. Neither pass caches autocast's weight casts.
//
// Thread safety: checkpoint() may run on a worker thread and recompute() on another; the two
// nodes then run in backward, ordered by fork/join, so their shared state needs no lock.
// is_checkpointing() and is_recomputing() are thread-local.
#pragma once

#include "gpipe/microbatch.h"

#include <ATen/core/ivalue.h>

#include <functional>
#include <ostream>
#include <string>

namespace gpipe {

/// Which micro-batches are checkpointed in training.
enum class CheckpointMode {
  kAlways,      ///< every micro-batch
  kExceptLast,  ///< all but the last, whose backward comes first and would recompute at once
  kNever,       ///< none
};

/// Parses "always", "except_last" or "never". Throws c10::ValueError for anything else.
CheckpointMode parse_checkpoint_mode(const std::string& name);
std::ostream& operator<<(std::ostream& out, CheckpointMode mode);

/// True while the calling thread runs a checkpointed forward (under no-grad).
bool is_checkpointing();

/// True while the calling thread recomputes a checkpointed forward in backward.
bool is_recomputing();

/// A function of one micro-batch, e.g. a partition's forward.
using BatchFunction = std::function<Batch(const Batch&)>;

/// Computes function(input) with checkpointing: the result is the same and so are the gradients,
/// but the activations inside `function` are recomputed in backward instead of being kept.
Batch checkpoint(BatchFunction function, const Batch& input);

namespace detail {

/// Makes is_checkpointing() true on the calling thread for a scope.
class EnableCheckpointing {
 public:
  EnableCheckpointing();
  ~EnableCheckpointing();
  EnableCheckpointing(const EnableCheckpointing&) = delete;
  EnableCheckpointing& operator=(const EnableCheckpointing&) = delete;

 private:
  bool previous_;
};

/// Makes is_recomputing() true on the calling thread for a scope.
class EnableRecomputing {
 public:
  EnableRecomputing();
  ~EnableRecomputing();
  EnableRecomputing(const EnableRecomputing&) = delete;
  EnableRecomputing& operator=(const EnableRecomputing&) = delete;

 private:
  bool previous_;
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

// Checkpointing: compute a function of a micro-batch without keeping its activations, and
// recompute them just before its backward. The result and the gradients are the same; dropout
// draws the same masks in the recomputation (the random number generators are restored) and
// autocast casts the same way (amp/autocast.h). GPipe and the schedule engines checkpoint their
// micro-batches by CheckpointMode; checkpoint() does it for one call.
//
// Thread safety: is_checkpointing() and is_recomputing() are thread-local.
#pragma once

#include "gpipe/microbatch.h"

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

/// Computes function(input) with checkpointing: the result is the same and so are the gradients,
/// but the activations inside `function` are recomputed in backward instead of being kept.
Batch checkpoint(BatchFunction function, const Batch& input);

}  // namespace gpipe

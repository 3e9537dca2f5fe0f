// What one stage of a plan holds, from its layers' costs (layer_costs.h): per micro-batch it
// holds, per gradient on its way, and throughout - the parts of plan.h's memory rule that a
// worker's moments of the schedule (validate.h: HeldMicrobatches) then add up.
#pragma once

#include "gpipe/checkpoint.h"
#include "gpipe/schedule/validate.h"
#include "plan/layer_costs.h"

#include <cstdint>
#include <limits>
#include <vector>

namespace gpipe {
namespace plan_detail {

struct StageMemory {
  int64_t activations = 0;  ///< a micro-batch's, from its forward to its backward
  int64_t pending = 0;      ///< more, past a split backward's input half
  /// More, at most, while a forward, a whole backward, an input half or a weight half runs.
  int64_t forward_transient = 0, backward_transient = 0, input_transient = 0, weight_transient = 0;
  /// A checkpointed micro-batch's: the stage's input, and on the last stage what the loss
  /// saved, as the loss runs outside the checkpoint.
  int64_t kept = 0;
  int64_t recomputed = 0;  ///< what a checkpointed backward recomputes: all but the loss's
  int64_t upstream = 0;    ///< a micro-batch's gradients on their way to the stage before
  int64_t downstream = 0;  ///< a micro-batch's output and skips, while later stages hold them
  int64_t fixed = 0;       ///< parameters, and gradients on their way further up
  int64_t input_bytes = 0, output_bytes = 0;  ///< a micro-batch's: its edges' messages
  /// The stage before, the stage after (under a split backward) runs on another worker, which
  /// may use what this stage sent it later than simulated.
  bool upstream_crosses = false, downstream_crosses = false;
  /// The stage before, the stage after is on another rank (PlanOptions::ranks), and what
  /// crosses is copied. Per micro-batch, the stage then also holds: its own copy of its input
  /// while the micro-batch lives here (checkpointed, that copy is what `kept` counts), and,
  /// checkpointed, its output, which within a process is the next stage's input; the message of
  /// an output sent, until its gradient comes back; the message of an input gradient sent, until
  /// the step ends. And per edge from another rank, the buffers of the receives posted ahead
  /// (up to `receive_window` of the messages still to come), and the one an action that starts
  /// takes.
  bool input_from_rank = false, output_to_rank = false;
  int64_t receive_window = 1;
  /// Between ranks, the bytes of a message's header, and the largest message a batch and its
  /// header are packed into (a copy); a larger batch goes as its own tensors, uncopied.
  int64_t message_header = 0;
  int64_t one_message_bytes = std::numeric_limits<int64_t>::max();

  /// What the stage holds at `moment` under `checkpoint`.
  int64_t held(const schedule::HeldMicrobatches& moment, CheckpointMode checkpoint) const;
  /// Between workers the simulated order is no promise: what the stage would hold more at
  /// `moment` if the stage before had not yet used one micro-batch's gradients it sent, or the
  /// stage after not yet freed one micro-batch's output.
  int64_t lagging(const schedule::HeldMicrobatches& moment) const;
};

/// Stage s of a balance whose stage t holds layers [first[t], first[t + 1]) of `layers`, the
/// last one followed by `loss`; the crossings left false.
StageMemory stage_memory(const std::vector<LayerCosts>& layers, const LayerCosts& loss,
                         const std::vector<int64_t>& first, int64_t s, double param_scale);

}  // namespace plan_detail
}  // namespace gpipe

// Schedule validation: simulates the workers' action lists and rejects a schedule that would
// deadlock, use a tensor before it arrives, or leave work undone, naming the offending action.
//
// The simulation runs in rounds. In each round every worker runs its actions in order until it has
// run one compute action (a forward, a backward or half of one) or must wait: a receive waits until
// the message is at the front of its edge's queue (messages sent in a round arrive in the next), a
// send waits while the queue holds `queue_capacity` messages. A round in which no worker moves
// is a deadlock. The round of each action is its time in render().
//
// Thread safety: pure functions.
#pragma once

#include "gpipe/schedule/action.h"

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace gpipe {
namespace schedule {

/// Options for validate() and simulate().
struct ValidateOptions {
  /// How many messages each edge's queue holds before a send waits; 0 for unbounded.
  /// Default: 0.
  TORCH_ARG(int64_t, queue_capacity) = 0;

  /// What messages call each worker, e.g. "line 3 (worker 1)" for a schedule read from a file;
  /// empty for "worker w". Default: empty.
  TORCH_ARG(std::vector<std::string>, worker_names) = {};

  /// A schedule of forwards only (an evaluation): it has no backwards and sends no gradients,
  /// and each micro-batch is done with once forwarded. Default: false.
  TORCH_ARG(bool, forward_only) = false;
};

/// The micro-batches a stage holds at one moment of a step.
struct HeldMicrobatches {
  /// What the stage starts at the moment, which allocates more as it runs: an action's kind.
  enum class Starting { kNothing, kForward, kBackward, kBackwardInput, kBackwardWeight };

  int64_t live = 0;      ///< forwarded, their weight gradient not computed yet
  int64_t awaiting = 0;  ///< of them, past their BackwardInput, waiting for the weight half
  Starting starting = Starting::kNothing;
  /// Past this stage's Backward or BackwardInput, their input gradients not yet used by the
  /// stage before: its Backward or BackwardInput of them has not run (the first stage's
  /// BackwardInput computes nothing: its BackwardWeight uses them).
  int64_t upstream = 0;
  /// Past this stage's weight gradient, their outputs still held by the next stage, whose weight
  /// gradient of them is not computed yet (only where backwards are split).
  int64_t downstream = 0;
  /// What crosses between ranks stays longer (plan.h's PlanOptions::ranks): in this step, input
  /// gradients this stage computed (its Backward or BackwardInput ran), and outputs it computed
  /// (its Forward ran), that no message received since says came. Each message says how many its
  /// sender has received on the edge back (gpipe/distributed/c10d_transport.h).
  int64_t sent_upstream = 0;
  int64_t unreturned = 0;
  /// This step's Forwards and Backwards (or BackwardInputs) of the stage not started yet, the
  /// one starting excluded: between ranks, the activations and gradients still to come, whose
  /// receives are posted ahead up to a window.
  int64_t forwards_left = 0;
  int64_t backwards_left = 0;

  bool operator<(const HeldMicrobatches& other) const {
    return std::tie(live, awaiting, starting, upstream, downstream, sent_upstream, unreturned,
                    forwards_left, backwards_left) <
           std::tie(other.live, other.awaiting, other.starting, other.upstream, other.downstream,
                    other.sent_upstream, other.unreturned, other.forwards_left,
                    other.backwards_left);
  }
};

/// When each action runs in the simulation.
struct Timeline {
  /// rounds[w][k] is the round in which actions[w][k] runs.
  std::vector<std::vector<int64_t>> rounds;
  /// The number of rounds in all.
  int64_t num_rounds = 0;
  /// peak_live_microbatches[s] is the most micro-batches stage s held at once: forwarded, with
  /// their weight gradient (Backward or BackwardWeight) not computed yet. Their graphs are what a
  /// stage keeps (Stage::peak_live_microbatches on a real step).
  std::vector<int64_t> peak_live_microbatches;
  /// peak_awaiting_weight_microbatches[s] is the most of them past their BackwardInput at once,
  /// holding what it left for their BackwardWeight (0 where backwards are not split).
  std::vector<int64_t> peak_awaiting_weight_microbatches;
  /// held_microbatches[w] lists, once each, what worker w held at the moments its memory can
  /// peak: as each compute action of one of its stages starts, and after each Forward and
  /// BackwardInput. Each moment has one entry per stage of w, in increasing stage order (one
  /// for a worker of one stage); `starting` marks the stage whose action starts.
  std::vector<std::vector<std::vector<HeldMicrobatches>>> held_microbatches;
};

/// Simulates `schedule`; throws c10::ValueError naming the worker, the position and the action
/// where it is invalid: an action of a stage that another worker runs, a micro-batch or stage out
/// of range, a forward before its input is received, a backward (or BackwardInput) before its
/// forward or before its output gradient is received, a BackwardWeight before the BackwardInput
/// of the same micro-batch and stage, a send of something not computed yet (SendGradient before
/// Backward or BackwardInput), a receive out of order, a duplicate, a deadlock (naming where every
/// waiting worker waits), or a forward, backward or message that never happens (naming the
/// worker whose stage it is).
Timeline simulate(const Schedule& schedule, const ValidateOptions& options = {});

/// simulate(), keeping only the verdict.
void validate(const Schedule& schedule, const ValidateOptions& options = {});

}  // namespace schedule
}  // namespace gpipe

// run_actions: runs one worker's list of actions (action.h) against its stages and a Transport.
//
// The loop shared by PipelineSchedule (one thread per worker, runtime.h) and
// distributed::PipelineStage (one process per worker, distributed/pipeline_stage.h): forwards and
// backwards call the Stage, sends and receives call the Transport (but between two stages of the
// same worker, as at the turn of a V), and what one action produces waits in a Mailbox
// (mailbox.h) until the action that uses it.
//
// Autocast: forwards (and the loss) run under the calling thread's settings, backwards with
// autocast off, as PyTorch's recipe runs loss.backward() outside the autocast scope.
//
// Internal to the engines. Thread safety: runs on the calling thread; the stages it runs must not
// be used elsewhere meanwhile. Each action is a trace span (trace.h) and tags its CPU allocations
// with its stage (memory.h).
#pragma once

#include "gpipe/microbatch.h"
#include "gpipe/schedule/action.h"
#include "gpipe/schedule/stage.h"
#include "gpipe/schedule/transport.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace gpipe {
namespace schedule {

/// What one step gives every worker: the micro-batches of the input (used by the first stage)
/// and of the target (used by the last), the scale of each micro-batch's loss, and the loss
/// function.
struct StepInputs {
  const std::vector<Batch>& inputs;
  const std::vector<Batch>& targets;  ///< none in an evaluation that computes no loss
  const std::vector<double>& scales;
  const LossFunction& loss;
  /// Set for an evaluation: forwards only (Stage::forward_only), and outputs[i] receives the last
  /// stage's output of micro-batch i where this worker runs it. Null in training.
  std::vector<Batch>* outputs = nullptr;
};

/// Runs `actions` in order. `stages[s]` is stage s (null for stages of other workers); a message
/// between two stages of this worker never reaches the transport;
/// losses[i] receives the scaled loss of micro-batch i where this worker runs the last stage
/// (in an evaluation, only where there are targets).
/// Rethrows the first exception of a stage or the transport; the stages then still hold what
/// was pending. REQUIRES: losses.size() is the number of micro-batches.
void run_actions(const std::vector<Action>& actions, const std::vector<Stage*>& stages,
                 Transport& transport, const StepInputs& step, std::vector<at::Tensor>& losses);

}  // namespace schedule
}  // namespace gpipe

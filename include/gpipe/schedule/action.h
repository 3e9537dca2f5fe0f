// Schedules as data: a pipeline schedule is, for each worker, the ordered list of the actions it
// runs (forward micro-batch i of stage s, backward, and the sends and receives between stages).
//
// Stages and workers: a model is cut into `num_stages` stages; `num_workers` workers (threads or
// processes) run them, as the schedule's Placement says. Looped: worker w runs every stage s with
// s % num_workers == w - one stage each (GPipe, 1F1B) or, interleaved, num_stages / num_workers
// "virtual" stages (Megatron-LM's looped placement). V: two stages per worker, worker w running
// stage w on the way down and stage 2W - 1 - w on the way back, so that worker 0 runs the first
// stage and the last:
//
//   looped, W = 2, 4 stages:  worker 0: 0 2     V, W = 2, 4 stages:  worker 0: 0 . . 3
//                             worker 1: 1 3                          worker 1: . 1 2 .
//
// Messages: stage s sends the activation of micro-batch i to stage s + 1 (kSendActivation on s,
// kRecvActivation on s + 1) and stage s + 1 sends the gradient of that input back
// (kSendGradient on s + 1, kRecvGradient on s); between two stages of one worker (the V's turn)
// they never leave it. A backward is either one kBackward or, in zero-bubble schedules,
// kBackwardInput (whose result is sent) and later kBackwardWeight. Each directed edge between two
// stages carries its messages first in, first out, so a receiver takes them in the order they
// were sent.
//
// Thread safety: plain values; a const Schedule may be read from any thread.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace gpipe {
namespace schedule {

/// What an action does.
enum class ActionKind {
  kForward,         ///< forward of one micro-batch on one stage (the last one adds the loss)
  kBackward,        ///< backward of one micro-batch on one stage
  kBackwardInput,   ///< the input-gradient half of a backward (zero-bubble schedules)
  kBackwardWeight,  ///< the weight-gradient half, after kBackwardInput of the same micro-batch
  kSendActivation,  ///< send the output of a forward to the next stage
  kRecvActivation,  ///< receive the input of a forward from the previous stage
  kSendGradient,    ///< send the gradient of a stage's input to the previous stage
  kRecvGradient,    ///< receive the gradient of a stage's output from the next stage
};

std::ostream& operator<<(std::ostream& out, ActionKind kind);

/// The name of a task of `kind` in traces (trace.h): "forward", "backward_input", ...
const char* trace_name(ActionKind kind);

/// True for kForward, kBackward, kBackwardInput and kBackwardWeight, the actions that compute.
bool is_compute(ActionKind kind);

/// Which worker runs which stage (the diagram above).
enum class Placement {
  kLooped,  ///< stage s on worker s % W
  kV,       ///< two stages per worker: stage s < W on worker s, stage s >= W on worker 2W - 1 - s
};

std::ostream& operator<<(std::ostream& out, Placement placement);

/// The worker that runs `stage` of `num_workers` workers under `placement`.
/// REQUIRES: stage is not negative; under kV, stage < 2 * num_workers.
int64_t worker_of(Placement placement, int64_t stage, int64_t num_workers);

/// One step of a worker: `kind` for micro-batch `microbatch` on stage `stage`.
struct Action {
  ActionKind kind;
  int64_t microbatch;
  int64_t stage;
};

bool operator==(const Action& a, const Action& b);
bool operator!=(const Action& a, const Action& b);

/// An action as messages name it, e.g. "Forward(microbatch=2, stage=1)".
std::string to_string(const Action& action);
std::ostream& operator<<(std::ostream& out, const Action& action);

/// An action as text, in PyTorch's compact notation <stage><kind><micro-batch>
/// (torch.distributed.pipelining), the one that schedules written as text use (schedule_file.h):
///
///   F  forward                 SEND_F  send the activation     RECV_F  receive the activation
///   B  backward                SEND_B  send the gradient       RECV_B  receive the gradient
///   I  backward, input half    W       backward, weight half
///
/// e.g. "2F1" for the forward of micro-batch 1 on stage 2. parse_action() reads it back.
std::string compact(const Action& action);

/// The action that `text` writes in compact notation: parse_action(compact(a)) == a. Throws
/// c10::ValueError quoting `text` if it is not one (FSDP's UNSHARD and RESHARD named as such).
Action parse_action(const std::string& text);

/// A whole schedule: what each worker runs, in order, for one training step.
///
/// Example (GPipe, 2 stages, 1 micro-batch):
///   worker 0: Forward(0, 0) SendActivation(0, 0) RecvGradient(0, 0) Backward(0, 0)
///   worker 1: RecvActivation(0, 1) Forward(0, 1) Backward(0, 1) SendGradient(0, 1)
struct Schedule {
  int64_t num_workers = 0;
  int64_t num_stages = 0;
  int64_t num_microbatches = 0;
  /// Which worker runs which stage; kV needs num_stages == 2 * num_workers.
  Placement placement = Placement::kLooped;
  /// actions[w] is the ordered list of worker w.
  std::vector<std::vector<Action>> actions;

  /// The worker that runs `stage`.
  int64_t worker_of(int64_t stage) const {
    return schedule::worker_of(placement, stage, num_workers);
  }
};

/// True if `schedule` splits its backwards into kBackwardInput and kBackwardWeight.
bool splits_backward(const Schedule& schedule);

}  // namespace schedule
}  // namespace gpipe

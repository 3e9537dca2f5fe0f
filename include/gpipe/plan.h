// The planner: which schedule, how many stages per worker, where to cut the model, how many
// micro-batches and whether to checkpoint, for a number of workers under a memory cap per
// worker - chosen from measured costs rather than guessed.
//
// plan() profiles every layer once per micro-batch size it considers (forward; the whole
// backward, and the backward split into its input and weight halves as the zero-bubble schedules
// split it; the activations its forward keeps for backward, what the input half leaves for the
// weight half and captures for it, and what its forward and each backward allocate while they
// run - the activations and what the input half leaves also as the layer runs after another in
// a stage, where its input can go; its input, which is what a checkpoint keeps and what a
// stage receives; its parameters). On the CPU it then calibrates
// the times: a few GPipe steps of the model on the workers show how much slower its layers run
// side by side than alone, and the profile is scaled by that. It searches every family -
// schedule kind x stages per worker x micro-batches x checkpoint mode - for its best balance,
// and ranks the families that fit the cap by predicted step time:
//
//   step time  predict() (schedule/predict.h) on the family's schedule with each stage's costs
//              the sum of its layers' (the last stage's with the loss's, where plan() has it);
//              a checkpointed backward also recomputes the forward. Workers that outnumber the
//              cores share them (PlanOptions::cores).
//   memory     per worker, the parameters (times param_scale: weights, gradients, optimizer
//              state) of its layers, plus the most its stages hold together at any moment of the
//              schedule (predict()'s held_microbatches: per worker, as each action starts and
//              after each forward and input half): each micro-batch forwarded holds the stage's
//              activations (the first layer's and what each next one adds: its input goes
//              unless it saved it; on the last stage, what the loss keeps); one past a split
//              backward's input half also holds what that half left for the weight half (the
//              gradients it captured, less what only it needed; on the first stage, whose input
//              half computes nothing, nothing more). An action that starts allocates more while
//              it runs: a forward, its layers' workspace, each beside what the layers before it
//              keep; a backward, its layers' backwards last to first, each beside the
//              activations of the layers before it, the gradient of its output and what it
//              allocates (on the last stage, the loss's backward first, beside all of them); an
//              input half, the same but freeing nothing until it ends, beside the gradients
//              captured so far; a weight half, its largest layer's workspace. The gradients a
//              stage sends upstream (of its input, and of the skips it popped from the stage
//              before) count until that stage's backward uses them, those of skips popped from
//              further up one micro-batch's; what it sent the next stage counts, once its own
//              graph is freed, until the next stage's weight half; between workers, one
//              micro-batch's more of either per moment, as if late. With checkpointing, each live
//              micro-batch holds only the stage's input, plus its whole activations while its
//              backward recomputes them (and the last micro-batch's, spared by kExceptLast).
//              Between ranks (PlanOptions::ranks), copies of what crosses: a stage's input per
//              micro-batch it holds, the message of each output and input gradient sent until
//              a message from its receiver says it came (else to the step's end); per edge from
//              another rank, the buffers of the receives posted ahead (the window's, of the
//              messages still to come) and of the one an action that starts takes, each message its
//              batch and header packed together up to 32 MiB (a larger batch goes uncopied,
//              and a receive ahead of it holds only its header); for a parameter tied
//              to another rank's layers, the receive of each other rank's part of its gradient
//              (in double) and the step's gradient beside the one set aside.
//   balance    starts from the partition whose slowest stage is fastest (block_partition), and
//              from the one whose largest stage is smallest, then moves one layer at a time
//              across a cut while that lowers the predicted step time (or, over the cap, the
//              memory): the best balance for the schedule, not only for its slowest stage.
//
// Families that cannot run, or that do not fit the cap with any balance found, are listed with
// the reason. The model must be a Sequential whose layers profile_times() can profile
// (balance/profile.h); the sample is one whole mini-batch.
//
// Thread safety: plan one model at a time, and do not use the model meanwhile (as the profilers
// of balance/profile.h). Profiling resets the sample's device's peak (memory.h: reset_peak).
#pragma once

#include "gpipe/checkpoint.h"
#include "gpipe/microbatch.h"
#include "gpipe/schedule/schedule_kind.h"
#include "gpipe/schedule/stage.h"

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace gpipe {

/// Options for plan().
///
/// Example:
///   gpipe::PlanOptions(4).memory_cap(512 << 20).param_scale(4.0)  // 4 workers, Adam
struct PlanOptions {
  /* implicit */ PlanOptions(int64_t workers) : workers_(workers) {}

  /// Worker threads or ranks, one device each. Required.
  TORCH_ARG(int64_t, workers);

  /// Bytes one worker may hold: its parameters (times param_scale) and activations. 0: no cap.
  TORCH_ARG(int64_t, memory_cap) = 0;

  /// The schedules to consider. Default: every kind (schedule_kind.h).
  TORCH_ARG(std::vector<schedule::ScheduleKind>, schedules) = schedule::all_schedule_kinds();

  /// The micro-batch counts to consider. Default: the powers of two from the workers' count
  /// (rounded up) to 8 times it, at most the batch size.
  TORCH_ARG(std::vector<int64_t>, microbatches) = {};

  /// Stages per worker for the kinds that loop stages (interleaved 1F1B and ZB1P, looped BFS).
  /// The V kinds always have 2, the others 1. Default: {2, 4}.
  TORCH_ARG(std::vector<int64_t>, looped_stages_per_worker) = std::vector<int64_t>{2, 4};

  /// Copies of its parameters each layer needs: 2 for weights and gradients, 3 for SGD with
  /// momentum, 4 for Adam. Default: 2.0.
  TORCH_ARG(double, param_scale) = 2.0;

  /// Whether the workers are ranks (processes, distributed::PipelineStage) rather than threads of
  /// one process. Between ranks what crosses is copied: a rank keeps its own copy of each input
  /// from another rank while its stage holds it, the message of each output and input gradient
  /// it sent until a message from its receiver says it came (at the step's end if none), and a
  /// buffer per receive posted ahead; and tied parameters' gradients are summed across ranks.
  /// Default: false.
  TORCH_ARG(bool, ranks) = false;

  /// Between ranks, the receives each rank posts ahead per edge, as the pipeline will be told
  /// (PipelineStageOptions::receive_window); each holds a buffer of one message. 0 for the
  /// pipeline's own choice, the most micro-batches a stage holds at once. Default: 0.
  TORCH_ARG(int64_t, receive_window) = 0;

  /// The link between two workers, as predict() models it: seconds from a send to its receive
  /// plus seconds per byte. Default: 0 and 0, the threads of one process.
  TORCH_ARG(double, latency) = 0;
  TORCH_ARG(double, seconds_per_byte) = 0;

  /// Intra-op threads each worker will run (PipelineScheduleOptions::intra_op_threads): the
  /// calibration's workers run as many, and they say how many workers the CPU's cores hold at
  /// once. Default: 1, the pipeline's.
  TORCH_ARG(int64_t, intra_op_threads) = 1;

  /// Workers that compute at full speed at once: with more computing, each is predicted to run
  /// at cores / computing of its speed, as threads sharing a CPU's cores do (predict()'s
  /// ActionCosts::cores; the calibration reads its pipeline's times the same way). 0: on the
  /// CPU, this machine's cores over intra_op_threads, at least 1; on other devices one per
  /// worker. Default: 0.
  TORCH_ARG(int64_t, cores) = 0;

  /// Profiling passes per layer and micro-batch size; each cost is the median. Default: 3.
  TORCH_ARG(int64_t, repetitions) = 3;

  /// On the CPU, whether to calibrate the profile: for each micro-batch count, train the model
  /// for 1 + `repetitions` GPipe steps on `workers` worker threads of `intra_op_threads` each
  /// (the counts taking turns) and scale the layers' times by what the steps' forwards and
  /// backwards took against their layers alone. Costs those steps; leaves the model as it was.
  /// Default: true.
  TORCH_ARG(bool, calibrate) = true;
};

/// One configuration and what it is predicted to cost.
struct Plan {
  schedule::ScheduleKind schedule = schedule::ScheduleKind::kGPipe;
  int64_t stages_per_worker = 1;
  /// Layers per stage, stage 0 first (worker_of(placement, stage) runs each).
  std::vector<int64_t> balance;
  int64_t microbatches = 1;
  CheckpointMode checkpoint = CheckpointMode::kNever;

  double step_seconds = 0;
  double bubble_fraction = 0;
  /// Per worker: parameters (times param_scale) and activations at their peak.
  std::vector<int64_t> peak_bytes;

  /// The largest of peak_bytes.
  int64_t largest_peak_bytes() const;
  /// "1f1b, 1 stage per worker, 8 micro-batches, checkpoint never".
  std::string family() const;
};

/// A family that plan() ruled out, and why.
struct Rejection {
  std::string family;
  std::string reason;
  /// Over the cap: the bytes its fullest worker holds with the leanest balance found; else 0.
  int64_t peak_bytes = 0;
};

/// How much slower a micro-batch size's layers ran in a pipeline than alone (PlanOptions::
/// calibrate): the factors the profile's times were multiplied by.
struct Calibration {
  int64_t microbatches = 1;
  double forward = 1, backward = 1;
};

/// What plan() found.
struct PlanReport {
  /// The families that fit the cap, each with its best balance, fastest first.
  std::vector<Plan> plans;
  std::vector<Rejection> rejected;
  /// One per micro-batch count where the profile was calibrated.
  std::vector<Calibration> calibration;
  /// The cores the workers were predicted to share (PlanOptions::cores); 0 for one each.
  int64_t cores = 0;
  /// How long profiling (calibration included) and the search took.
  double profile_seconds = 0;
  double search_seconds = 0;

  /// The fastest plan. Throws c10::ValueError, with the rejections, if none fits.
  const Plan& best() const;
};

/// Profiles `model` on `sample` (one mini-batch) and searches as the top of this file says.
/// Throws c10::ValueError for a model without layers, fewer than one worker, a negative cap, no
/// schedules, a micro-batch count below 1 or above the batch size, param_scale below 0, a
/// negative link, receive window or count of cores, fewer than one intra-op thread or
/// repetition; and as profile_times() for a model it cannot profile.
///
/// Without a loss, the last stage's backward is taken to start from the output as its own
/// gradient (the loss half the sum of its squares, free), and the calibration trains with that.
PlanReport plan(torch::nn::Sequential model, const Batch& sample, const PlanOptions& options);

/// As above, with the loss the pipeline will train with (as PipelineSchedule takes it) and the
/// mini-batch's target: the loss's forward and backward, what its forward keeps until backward
/// and what its backward allocates count to the last stage, and the calibration trains with it.
/// A loss that costs as much as a layer (cross-entropy over a large vocabulary) moves the
/// balance. Throws c10::ValueError, besides the above, for a target of another batch size or a
/// loss that does not return a scalar.
PlanReport plan(torch::nn::Sequential model, const Batch& sample, const Batch& target,
                const schedule::LossFunction& loss, const PlanOptions& options);

/// The report as a table: the plans (at most `rows`), then the rejections.
std::ostream& operator<<(std::ostream& out, const PlanReport& report);

}  // namespace gpipe

// PipelineSchedule: trains a model split into stages with an explicit pipeline schedule (GPipe,
// 1F1B, ZB1P, interleaved 1F1B and ZB1P, looped BFS, ZBV, or one's own), one worker thread per
// group of stages, forward and backward running in parallel across stages.
//
// step(input, target) splits the batch into micro-batches, validates the schedule (validate.h),
// and starts one thread per worker, each running its list of actions; a ThreadTransport carries
// activations and gradients between them. The last stage computes loss(output_i, target_i) for
// micro-batch i and backward starts from it; step() returns the loss of the whole batch and leaves
// in every parameter's grad the sum of the micro-batches' gradients, which equals that of one
// backward of the full batch when:
//   - LossReduction::kMean (the default): the loss function averages over the micro-batch (like
//     torch::mse_loss's default); micro-batch i's loss is scaled by its share size_i / N of the
//     batch, so the scaled losses add up to the full batch's mean, even for unequal micro-batches.
//     step() returns that sum: the average of the micro-batch losses, weighted by size.
//   - LossReduction::kSum: the loss function sums over the micro-batch; nothing is scaled and
//     step() returns the sum.
// As with loss.backward(), gradients accumulate: zero them between steps.
//
// The recipes of real training keep that promise:
//   - Autocast: every worker runs its stages under the thread-local state of the thread that
//     called step() (grad mode, autocast and its dtypes; amp/autocast.h), and a checkpoint's
//     recomputation under that of its forward.
//   - Tied weights: a parameter that several stages share (an embedding reused as the output
//     projection) is one tensor whose gradient sums every stage's part: each worker adds up its
//     own parts, then the workers' sums are added in worker order, so every run (and
//     PipelineStage on ranks) gives the same bits. Its stages must share a device. parameters()
//     lists each parameter once: give those to the optimizer.
//   - Gradient clipping over the whole model: clip_grad_norm().
//   - Loss scaling for float16: the grad_scaler option (amp/grad_scaler.h).
//   - Evaluation: evaluate() runs the forwards only, under the same schedule's order.
//
// Intra-op threads: each worker calls at::set_num_threads(intra_op_threads) on its own thread.
// With LibTorch's OpenMP backend that sets the OpenMP thread count of that thread's parallel
// regions only (an OpenMP ICV per thread), so stages do not steal each other's threads; it also
// stores the count as LibTorch's default for threads that start later. BLAS libraries keep their
// own, process-wide thread count (OpenBLAS: openblas_set_num_threads or OPENBLAS_NUM_THREADS),
// which this class does not change: with one thread per stage, set OPENBLAS_NUM_THREADS=1.
//
// Failures: an exception in any stage aborts the transport, so every other worker stops at its
// next send or receive; step() joins all workers, drops the pending micro-batches and rethrows
// the first exception with its message.
//
// Thread safety: one step() at a time per PipelineSchedule (concurrent calls are serialized by a
// mutex). The stage modules must not be used elsewhere during step().
#pragma once

#include "gpipe/microbatch.h"
#include "gpipe/schedule/action.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/options.h"
#include "gpipe/schedule/stage.h"
#include "gpipe/schedule/transport.h"
#include "gpipe/trace.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <vector>

namespace gpipe {
namespace detail {
class TiedGradients;  // src/schedule/tied_gradients.h
}  // namespace detail

namespace schedule {
namespace detail {
class ScheduleCache;  // src/schedule/engine.h
}  // namespace detail

struct StepInputs;  // src/schedule/run_actions.h

/// Options for PipelineSchedule: those of both engines (options.h), and its stages' devices.
///
/// Example:
///   gpipe::schedule::PipelineSchedule pipe(
///       {stage0, stage1}, loss,
///       gpipe::schedule::PipelineScheduleOptions(8).schedule(
///           gpipe::schedule::ScheduleKind::kOneFOneB));
struct PipelineScheduleOptions : ScheduleOptions<PipelineScheduleOptions> {
  /// With `chunks` micro-batches per step, and one intra-op thread per worker thread.
  /* implicit */ PipelineScheduleOptions(int64_t chunks);

  /// The device of each stage. Default: every stage on CPU.
  TORCH_ARG(std::vector<c10::Device>, devices) = {};

  /// Messages each edge between stages holds before a send waits; 0 for the number of
  /// micro-batches (sends never wait). Default: 0.
  TORCH_ARG(int64_t, queue_capacity) = 0;
};

/// What evaluate() returns (both engines).
struct Evaluation {
  /// The loss of the whole batch, reduced as step()'s (LossReduction); undefined without a
  /// target. On every rank.
  at::Tensor loss;
  /// The model's output for the whole batch, its micro-batches' outputs gathered; only where the
  /// last stage runs (other ranks: empty).
  c10::optional<Batch> output;
};

/// A model trained with an explicit pipeline schedule.
class PipelineSchedule {
 public:
  /// One Sequential per stage, in order. Throws c10::ValueError for no stages, an empty stage,
  /// a stage count that the schedule cannot run, a non-positive option, checkpoint with a
  /// schedule that splits backwards, or a tied parameter whose stages are on different devices;
  /// c10::TypeError for skips (skip/skippable.h) whose stashes and pops do not pair up across
  /// the stages; c10::IndexError for too few devices.
  PipelineSchedule(std::vector<torch::nn::Sequential> stages, LossFunction loss,
                   PipelineScheduleOptions options);

  /// `module` split into stages of `balance` consecutive layers each (layers are shared, not
  /// copied). Throws c10::ValueError if balance does not add up to the number of layers.
  PipelineSchedule(const torch::nn::Sequential& module, const std::vector<int64_t>& balance,
                   LossFunction loss, PipelineScheduleOptions options);

  ~PipelineSchedule();

  /// One training step on `input` with `target` (split like the input): forward and backward of
  /// every micro-batch in the schedule's order. Returns the loss (see the top of this file),
  /// detached; the parameters' gradients accumulate. Throws c10::ValueError if input and target
  /// differ in batch size or grad mode is off (no-grad, inference mode), and rethrows the first
  /// exception of any stage.
  at::Tensor step(const Batch& input, const Batch& target);

  /// The forwards of `input`'s micro-batches (in the order step()'s schedule runs them) under
  /// no-grad, keeping nothing for backward: the model's output and, with a target, the loss as
  /// step() computes it. Takes the modules as they are: call eval() on them first for dropout
  /// and batch norm's evaluation behaviour. Throws like step().
  Evaluation evaluate(const Batch& input);
  Evaluation evaluate(const Batch& input, const Batch& target);

  /// Every parameter of the stages once (a tied one once), in the model's order: what an
  /// optimizer takes.
  std::vector<at::Tensor> parameters() const;

  /// Clips the gradients of parameters() as torch::nn::utils::clip_grad_norm_ clips those of the
  /// plain model, and returns their total norm. Throws c10::ValueError for a negative max_norm or
  /// norm_type.
  double clip_grad_norm(double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false);

  /// The schedule step() runs for `num_microbatches` micro-batches, validated. Throws
  /// c10::ValueError unless num_microbatches is positive.
  Schedule schedule(int64_t num_microbatches);

  int64_t num_stages() const { return static_cast<int64_t>(stages_.size()); }
  int64_t num_workers() const { return num_workers_; }
  const PipelineScheduleOptions& options() const { return options_; }

  /// The stage module of stage `index`. Throws c10::IndexError out of range.
  torch::nn::Sequential& stage_module(int64_t index);

  /// The most micro-batches whose activations stage `index` held at once in the last step() (0
  /// after an evaluate(), which holds none).
  /// Throws c10::IndexError out of range.
  int64_t peak_live_microbatches(int64_t index) const;

 private:
  // Runs every worker of `schedule` on its thread, under the calling thread's state; rethrows
  // the first failure.
  void run_workers(const Schedule& schedule, const StepInputs& step,
                   std::vector<at::Tensor>& losses, int64_t queue_capacity);
  void run_worker(int64_t worker, const Schedule& schedule, const StepInputs& step,
                  std::vector<at::Tensor>& losses, Transport& transport);
  Evaluation run_evaluation(const Batch& input, const Batch* target);

  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<at::Tensor> parameters_;                            // each once, in the model's order
  std::unique_ptr<gpipe::detail::TiedGradients> tied_gradients_;  // where stages share parameters
  LossFunction loss_;
  PipelineScheduleOptions options_;
  int64_t num_workers_;
  std::unique_ptr<detail::ScheduleCache> schedules_;  // guarded by mutex_
  int64_t steps_ = 0;  // step() calls so far, to name steps in traces
  std::mutex mutex_;   // serializes step()
};

}  // namespace schedule
}  // namespace gpipe

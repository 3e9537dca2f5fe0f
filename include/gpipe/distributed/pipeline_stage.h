// PipelineStage: this process's part of a pipeline trained with an explicit schedule across
// processes (one worker per rank), the multi-process counterpart of schedule::PipelineSchedule.
//
// Every rank builds the same model (e.g. from the same seed or checkpoint) and keeps its own
// stages: with W ranks and v stages per rank (stages_per_worker, options.h), rank r runs stages
// r, r + W, ..., r + (v - 1) W, or, where the schedule's placement is a V, stages r and
// 2W - 1 - r (whose turn at rank W - 1 passes tensors within the process). step(input, target) runs
// this rank's actions of the schedule; a C10dTransport carries activations and gradients between
// ranks. Each rank's parameters then hold the same gradients as after one backward of the full
// batch through the plain model (see runtime.h for the loss scaling), and step() returns the loss
// on every rank: the last stage's rank sends it to the others.
//
// Every rank of a pipeline passes the same batch to step() (at least tensors of the right batch
// size): the first stage's rank reads the input, the last stage's rank the target, and every rank
// derives the number of micro-batches from the batch size.
//
// Training recipes (see runtime.h for threads): every rank computes under its calling thread's
// autocast settings; a parameter shared by stages on different ranks (tied weights, found by
// identity in the model every rank builds) has a copy on each of those ranks, checked equal at
// construction (c10::ValueError naming it and its ranks otherwise) and whose gradients are summed
// among those ranks after every step, so the copies get the plain model's gradient and stay
// equal; clip_grad_norm() clips by the norm over every rank's parameters; the grad_scaler option
// agrees on overflow with every rank; evaluate() runs the forwards only. Give the optimizer
// parameters(): each of this rank's once.
//
// Tracing: a tracer in the options joins the ranks' timeline (trace.h) as this rank, its clock
// aligned with rank 0's through the store as the ranks connect (to within half the round trip of
// a few store calls: 0.1-0.4 ms on one machine; Tracer::clock_uncertainty_us says).
// Each rank's trace file then merges with the others' into one timeline (`gpipe trace merge`).
//
// Failures: an exception on any rank makes step() throw c10::Error on every rank, naming the rank
// that failed first and its message, within the timeout; a rank killed or hung is named by the
// rank that waited for it. Catch it and exit the process: a failed PipelineStage cannot step
// again. Destroy the PipelineStage (do not let the exception escape main) so that rank 0, which
// serves the store, waits until the others have seen the failure.
//
// Several PipelineStages in one process (one after another, or stepping in turns):
// rendezvous once and build them all over that ProcessGroup, in the same order on every rank.
// Each one that reads the environment itself starts its own store on MASTER_PORT, which only
// works after the previous one is gone on every rank.
//
// Thread safety: one step() at a time; the modules must not be used elsewhere during step().
#pragma once

#include "gpipe/checkpoint.h"
#include "gpipe/distributed/c10d_transport.h"
#include "gpipe/distributed/data_parallel.h"
#include "gpipe/distributed/environment.h"
#include "gpipe/distributed/rendezvous.h"
#include "gpipe/microbatch.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/runtime.h"
#include "gpipe/schedule/stage.h"
#include "gpipe/trace.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace gpipe {
namespace distributed {
class RankParameters;  // src/distributed/rank_parameters.h

/// Options for PipelineStage.
///
/// Example:
///   gpipe::distributed::PipelineStage stage(
///       model, {4, 4}, loss,
///       gpipe::distributed::PipelineStageOptions(8).schedule(
///           gpipe::schedule::ScheduleKind::kOneFOneB));
struct PipelineStageOptions : schedule::ScheduleOptions<PipelineStageOptions> {
  /// With `chunks` micro-batches per step; intra-op threads left as LibTorch sets them.
  /* implicit */ PipelineStageOptions(int64_t chunks);

  /// The longest any send or receive waits for its peer, or any call for the store, before a
  /// rank counts as failed: the one that stopped answering (c10d_transport.h). Default: 300 s.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(300);

  /// The longest the ranks wait for each other to start and connect (rendezvous.h), and the
  /// limit of the replicas' all-reduce. Default: 300 s.
  TORCH_ARG(std::chrono::milliseconds, rendezvous_timeout) = std::chrono::seconds(300);

  /// How often each rank looks for failures of the others. Default: 50 ms.
  TORCH_ARG(std::chrono::milliseconds, poll_interval) = std::chrono::milliseconds(50);

  /// Replicas of the pipeline (pipeline x data parallelism): WORLD_SIZE = ranks per pipeline x
  /// data_parallel; replica d runs on a block of consecutive ranks, each replica trains on its
  /// own batch, and after each step every stage's gradients and the loss are averaged (summed
  /// for LossReduction::kSum) over its replicas (data_parallel.h). Default: 1.
  TORCH_ARG(int64_t, data_parallel) = 1;

  /// Where this rank's stages run: their layers are moved there, and activations and gradients
  /// travel from device to device (CUDA over NCCL, CPU over Gloo). The input and target may be
  /// anywhere; the loss comes back on the CPU. Default: cuda:LOCAL_RANK where CUDA is available,
  /// else the CPU.
  TORCH_ARG(c10::optional<c10::Device>, device) = c10::nullopt;

  /// The most receives each rank posts ahead on one edge (c10d_transport.h), so that senders
  /// never wait for a receiving rank to ask; each holds a buffer as large as the edge's largest
  /// message. 0 for the most micro-batches any stage holds at once under the schedule with
  /// `chunks` micro-batches (the whole step's under GPipe, about the number of stages under
  /// 1F1B). A rank holds each buffer from the moment its receive is posted (the planner counts
  /// them: PlanOptions::receive_window). Default: 0.
  TORCH_ARG(int64_t, receive_window) = 0;
};

/// The device a rank uses by default: cuda:LOCAL_RANK where LibTorch sees CUDA devices, else the
/// CPU.
c10::Device default_device(const Environment& environment);

/// This rank's stages of a pipeline across processes.
class PipelineStage {
 public:
  /// `module` split into stages of `balance` consecutive layers; this rank keeps its own (the
  /// layers are shared, not copied). Reads the environment (environment.h) and joins the other
  /// ranks (rendezvous.h). Throws c10::ValueError for a bad environment, a balance that does not
  /// add up to the module's layers, a number of stages other than
  /// WORLD_SIZE x stages_per_worker, or (on every rank) a tied parameter whose copies differ.
  PipelineStage(const torch::nn::Sequential& module, const std::vector<int64_t>& balance,
                schedule::LossFunction loss, PipelineStageOptions options);

  /// The same over an already connected `group`.
  PipelineStage(ProcessGroup group, const torch::nn::Sequential& module,
                const std::vector<int64_t>& balance, schedule::LossFunction loss,
                PipelineStageOptions options);

  /// Stops the transport; see the top of this file.
  ~PipelineStage();

  /// One training step; see the top of this file. Returns the loss of the whole batch on every
  /// rank, detached. Throws c10::ValueError for a bad batch, c10::Error naming the failed rank.
  at::Tensor step(const Batch& input, const Batch& target);

  /// The forwards only, under no-grad and keeping nothing, in the order of step()'s schedule:
  /// the loss (with a target) on every rank, averaged over replicas like step()'s, and the
  /// model's output where the last stage runs. Every rank calls it, with the same batch size.
  /// Takes the modules as they are (eval() them first for dropout and batch norm).
  schedule::Evaluation evaluate(const Batch& input);
  schedule::Evaluation evaluate(const Batch& input, const Batch& target);

  /// This rank's parameters, each once (a tied one once), in the model's order: what its
  /// optimizer takes.
  std::vector<at::Tensor> parameters() const;

  /// Clips the gradients of every rank's parameters by their total norm, as
  /// torch::nn::utils::clip_grad_norm_ clips the plain model's, and returns the norm; a tied
  /// parameter counts once. Every rank calls it. The total is bitwise the plain model's for the
  /// same gradients: each parameter's norm comes from one rank and every rank reduces them in the
  /// model's order. Throws c10::ValueError for a negative max_norm or norm_type.
  double clip_grad_norm(double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false);

  int64_t rank() const { return transport_->rank(); }
  int64_t world_size() const { return transport_->world_size(); }
  int64_t num_stages() const { return num_stages_; }
  const PipelineStageOptions& options() const { return options_; }
  /// Ranks per pipeline: WORLD_SIZE / data_parallel.
  int64_t pipeline_size() const { return transport_->pipeline_size(); }
  /// Which replica of the pipeline this rank belongs to, in [0, data_parallel).
  int64_t replica() const { return rank() / pipeline_size(); }

  /// The device of this rank's stages.
  c10::Device device() const { return transport_->device(); }

  /// The stages this rank runs, in increasing order.
  std::vector<int64_t> stage_indices() const;

  /// The module of stage `index`. Throws c10::IndexError unless this rank runs it.
  torch::nn::Sequential& stage_module(int64_t index);

  /// Seconds this rank spent waiting in sends, receives and the replicas' all-reduce during the
  /// last step().
  double last_communication_seconds() const { return last_communication_seconds_; }
  /// Of those, the seconds spent moving data: receiving tensors whose header had arrived,
  /// waiting for sends to be received at the end, and the all-reduce.
  double last_transfer_seconds() const { return last_transfer_seconds_; }

  /// The schedule for `num_microbatches` micro-batches (every rank's actions).
  const schedule::Schedule& schedule(int64_t num_microbatches);

 private:
  // A training step, or an evaluation.
  schedule::Evaluation run(const Batch& input, const Batch* target, bool training);
  // Announces to the transport the receives of `actions` (this rank's), on both lanes.
  void expect_receives(const std::vector<schedule::Action>& actions);
  // The receive window of receive_window(0): the schedule's peak of live micro-batches.
  int64_t automatic_receive_window();

  PipelineStageOptions options_;
  schedule::LossFunction loss_;
  int64_t num_stages_ = 0;
  std::vector<std::unique_ptr<schedule::Stage>> stages_;  // this rank's, in order
  std::vector<schedule::Stage*> by_index_;                // by stage index; null elsewhere
  std::unique_ptr<ReplicaGroup> replicas_;                // with data_parallel > 1
  std::unique_ptr<RankParameters> parameters_;
  std::unique_ptr<C10dTransport> transport_;
  std::unique_ptr<schedule::detail::ScheduleCache> schedules_;
  int64_t steps_ = 0;  // step() calls so far, to name steps in traces
  double last_communication_seconds_ = 0;
  double last_transfer_seconds_ = 0;
};

}  // namespace distributed
}  // namespace gpipe

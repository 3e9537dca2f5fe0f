// What both schedule engines take: PipelineScheduleOptions (workers are threads, runtime.h) and
// distributed::PipelineStageOptions (workers are ranks, pipeline_stage.h) derive from
// ScheduleOptions and add only what differs: where their stages run and how they talk.
#pragma once

#include "gpipe/checkpoint.h"
#include "gpipe/schedule/action.h"
#include "gpipe/schedule/schedule_kind.h"
#include "gpipe/trace.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

namespace gpipe {
namespace amp {
class GradScaler;  // amp/grad_scaler.h
}  // namespace amp

namespace schedule {

/// How the loss function reduces over a micro-batch (runtime.h says what step() returns).
enum class LossReduction {
  kMean,  ///< an average: micro-batch losses are scaled by their share of the batch
  kSum,   ///< a sum: micro-batch losses add up unscaled
};

std::ostream& operator<<(std::ostream& out, LossReduction reduction);

/// The options of both schedule engines. Every setter returns the engine's own options, so
/// they chain with its other setters:
///   PipelineScheduleOptions(8).schedule(ScheduleKind::kZeroBubble).devices(devices)
/// The engines check them with one rule (check_schedule_options, schedule_kind.h).
template <typename Options>
class ScheduleOptions {
 public:
  /// How many micro-batches to split each batch into (fewer when the batch is smaller).
  /// Required; positive.
  Options& chunks(int64_t value) { return chunks_ = value, self(); }
  int64_t chunks() const { return chunks_; }

  /// The schedule. Default: ScheduleKind::kOneFOneB.
  Options& schedule(ScheduleKind value) { return schedule_ = value, self(); }
  ScheduleKind schedule() const { return schedule_; }

  /// A schedule of one's own (e.g. from read_schedule_file, schedule_file.h) instead of a
  /// generated one: its workers and stages must be the engine's, and each step must have its
  /// number of micro-batches; schedule() and stages_per_worker() are not used. Default: none.
  Options& custom_schedule(Schedule value) { return custom_schedule_ = std::move(value), self(); }
  const std::optional<Schedule>& custom_schedule() const { return custom_schedule_; }

  /// Which worker runs which stage: the custom schedule's placement, or schedule()'s.
  Placement placement() const {
    return custom_schedule_ ? custom_schedule_->placement : placement_of(schedule_);
  }

  /// Stages per worker: 1, any number for the loops_stages() kinds (worker w runs stages w,
  /// w + W, ... of W workers), 2 for the kinds placement_of() puts in a V (stages w and
  /// 2W - 1 - w); schedule_kind.h. Default: 1.
  Options& stages_per_worker(int64_t value) { return stages_per_worker_ = value, self(); }
  int64_t stages_per_worker() const { return stages_per_worker_; }

  /// Activation checkpointing in every stage: a checkpointed forward keeps only its input and
  /// its backward recomputes. kExceptLast spares the step's last micro-batch, as in GPipe. Not
  /// with the kinds that splits_backward() (schedule_kind.h), whose split it cannot split.
  /// Default: CheckpointMode::kNever.
  Options& checkpoint(CheckpointMode value) { return checkpoint_ = value, self(); }
  CheckpointMode checkpoint() const { return checkpoint_; }

  /// How the loss function reduces a micro-batch. Default: LossReduction::kMean.
  Options& loss_reduction(LossReduction value) { return loss_reduction_ = value, self(); }
  LossReduction loss_reduction() const { return loss_reduction_; }

  /// at::set_num_threads() on each worker; 0 leaves the thread count alone. Default: 1 for
  /// worker threads (one process shares the cores), 0 for ranks.
  Options& intra_op_threads(int64_t value) { return intra_op_threads_ = value, self(); }
  int64_t intra_op_threads() const { return intra_op_threads_; }

  /// Records every action of every step (trace.h); null for none. Actions also tag their CPU
  /// allocations with their stage (memory.h). Default: null.
  Options& tracer(std::shared_ptr<trace::Tracer> value) {
    return tracer_ = std::move(value), self();
  }
  const std::shared_ptr<trace::Tracer>& tracer() const { return tracer_; }

  /// Loss scaling for float16 (amp/grad_scaler.h): each step scales its losses by the scaler's
  /// scale, unscales its gradients and agrees with every rank whether any overflowed; the
  /// training loop then calls the scaler's step(optimizer) and update(). Null for none.
  /// Default: null.
  Options& grad_scaler(std::shared_ptr<amp::GradScaler> value) {
    return grad_scaler_ = std::move(value), self();
  }
  const std::shared_ptr<amp::GradScaler>& grad_scaler() const { return grad_scaler_; }

  /// The rules of both engines: chunks positive, intra_op_threads not negative, and
  /// check_schedule_options's (stages per worker, checkpointing) with `worker` saying what a
  /// worker is ("worker", "rank"); a custom schedule that splits backwards refuses checkpointing.
  /// Throws c10::ValueError naming the option.
  void check(const std::string& worker) const {
    TORCH_CHECK_VALUE(chunks_ > 0, "chunks must be positive, but got ", chunks_);
    TORCH_CHECK_VALUE(intra_op_threads_ >= 0, "intra_op_threads must be non-negative, but got ",
                      intra_op_threads_);
    if (custom_schedule_) {
      TORCH_CHECK_VALUE(
          checkpoint_ == CheckpointMode::kNever || !splits_backward(*custom_schedule_),
          "the custom schedule splits backwards into input and weight gradients, "
          "which checkpoint cannot");
      return;
    }
    ScheduleOptionNames names;
    names.worker = worker;
    check_schedule_options(schedule_, stages_per_worker_, checkpoint_, names);
  }

 protected:
  ScheduleOptions(int64_t chunks, int64_t intra_op_threads)
      : chunks_(chunks), intra_op_threads_(intra_op_threads) {}

 private:
  Options& self() { return static_cast<Options&>(*this); }

  int64_t chunks_;
  ScheduleKind schedule_ = ScheduleKind::kOneFOneB;
  int64_t stages_per_worker_ = 1;
  CheckpointMode checkpoint_ = CheckpointMode::kNever;
  LossReduction loss_reduction_ = LossReduction::kMean;
  int64_t intra_op_threads_;
  std::shared_ptr<trace::Tracer> tracer_;
  std::shared_ptr<amp::GradScaler> grad_scaler_;
  std::optional<Schedule> custom_schedule_;
};

}  // namespace schedule
}  // namespace gpipe

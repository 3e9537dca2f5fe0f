// What the two schedule engines share: PipelineSchedule (a thread per worker, runtime.h) and
// distributed::PipelineStage (a process per worker, pipeline_stage.h) differ only in where their
// workers run and which transport carries tensors between them. Both check their stages with
// verify_skips, and each step splits its batch with split_step, takes the
// schedule from a ScheduleCache, begins the step on its stages, runs its actions (run_actions.h)
// and adds up the losses with total_loss.
//
// Internal to the engines.
#pragma once

#include "schedule/run_actions.h"

#include "gpipe/microbatch.h"
#include "gpipe/schedule/action.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/runtime.h"
#include "gpipe/skip/layout.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace gpipe {
namespace schedule {
namespace detail {

/// Throws c10::ValueError unless the calling thread is in grad mode: a training step needs it
/// (under no-grad or inference mode, evaluate() runs forwards only).
void check_training_mode();

/// The layout of the skip connections of `stages` (each stage gets its routes from it). Throws
/// c10::TypeError for stashes and pops that do not pair up across the pipeline.
skip::SkipLayout verify_skips(const std::vector<torch::nn::Sequential>& stages);

/// One step's micro-batches of the input and of the target, and the scale of each one's loss.
struct StepBatches {
  std::vector<Batch> inputs;
  std::vector<Batch> targets;  // none in an evaluation without targets
  std::vector<double> scales;

  int64_t size() const { return static_cast<int64_t>(inputs.size()); }
  StepInputs with(const LossFunction& loss) const {
    return StepInputs{inputs, targets, scales, loss};
  }
};

/// Splits `input` and `target` into at most `chunks` micro-batches; under kMean each one's loss
/// is scaled by its share of the batch (runtime.h). Without a target (an evaluation that only
/// computes outputs), `targets` stays empty. Throws c10::ValueError for a bad batch or batches of
/// different sizes.
StepBatches split_step(const Batch& input, const Batch* target, int64_t chunks,
                       LossReduction reduction);

/// The loss of the whole batch: the sum of the micro-batches' scaled losses.
at::Tensor total_loss(const std::vector<at::Tensor>& losses);

/// The validated schedule of each number of micro-batches, made once; or the custom one.
class ScheduleCache {
 public:
  /// `kind` over `num_stages` stages on `num_workers` workers, or `custom` where there is one;
  /// edges hold `queue_capacity` messages (0: as many as there are micro-batches). Throws
  /// c10::ValueError for a custom schedule of other numbers of workers or stages.
  ScheduleCache(ScheduleKind kind, int64_t num_workers, int64_t num_stages, int64_t queue_capacity,
                std::optional<Schedule> custom = std::nullopt);

  /// Throws c10::ValueError unless num_microbatches is positive, or for a custom schedule,
  /// unless it is the custom schedule's.
  const Schedule& get(int64_t num_microbatches);

  /// The schedule of an evaluation of `num_microbatches` micro-batches: get()'s forwards and
  /// their messages, in its order (with every send unbounded, a part of a valid schedule runs).
  const Schedule& forward_only(int64_t num_microbatches);

  /// Makes the schedule of the fewest micro-batches it runs (or the custom one): fails early,
  /// before any step, for stages the schedule cannot run.
  void prepare() {
    get(custom_ ? custom_->num_microbatches : min_microbatches(kind_, num_stages_));
  }

 private:
  std::optional<Schedule> custom_;
  ScheduleKind kind_;
  int64_t num_workers_;
  int64_t num_stages_;
  int64_t queue_capacity_;
  std::map<int64_t, Schedule> schedules_;
  std::map<int64_t, Schedule> forward_only_;
};

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

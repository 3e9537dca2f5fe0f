#include "schedule/engine.h"

#include "gpipe/schedule/validate.h"
#include "gpipe/skip/layout.h"
#include "gpipe/skip/skippable.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <utility>

namespace gpipe {
namespace schedule {
namespace detail {

void check_training_mode() {
  TORCH_CHECK_VALUE(at::GradMode::is_enabled(),
                    "step() trains, which needs grad mode, but it was called under no-grad or "
                    "inference mode (evaluate() runs the forwards only)");
}

skip::SkipLayout verify_skips(const std::vector<torch::nn::Sequential>& stages) {
  // Stashes and pops pair up across the pipeline as in the whole model, its layers numbered as
  // in it.
  torch::nn::Sequential whole;
  for (const auto& stage : stages) {
    for (const auto& layer : *stage) whole->push_back(layer);
  }
  skip::verify_skippables(whole);
  return skip::inspect_skip_layout(stages);
}

StepBatches split_step(const Batch& input, const Batch* target, int64_t chunks,
                       LossReduction reduction) {
  check(input);
  const int64_t N = input[0].size(0);
  StepBatches step{scatter(input, chunks), {}, {}};
  const int64_t M = step.size();
  if (target != nullptr) {
    check(*target);
    TORCH_CHECK_VALUE((*target)[0].size(0) == N, "input and target must have the same batch size, ",
                      "but the input has ", N, " and the target ", (*target)[0].size(0));
    step.targets = scatter(*target, chunks);
    TORCH_INTERNAL_ASSERT(static_cast<int64_t>(step.targets.size()) == M);
  }
  step.scales.assign(M, 1.0);
  if (reduction == LossReduction::kMean) {
    for (const auto i : c10::irange(M)) {
      step.scales[i] = static_cast<double>(step.inputs[i][0].size(0)) / static_cast<double>(N);
    }
  }
  return step;
}

at::Tensor total_loss(const std::vector<at::Tensor>& losses) {
  at::Tensor total = losses.at(0);
  for (const auto i : c10::irange(1, losses.size())) total = total + losses[i];
  return total;
}

ScheduleCache::ScheduleCache(ScheduleKind kind, int64_t num_workers, int64_t num_stages,
                             int64_t queue_capacity, std::optional<Schedule> custom)
    : custom_(std::move(custom)),
      kind_(kind),
      num_workers_(num_workers),
      num_stages_(num_stages),
      queue_capacity_(queue_capacity) {
  if (!custom_) return;
  TORCH_CHECK_VALUE(custom_->num_workers == num_workers && custom_->num_stages == num_stages,
                    "the custom schedule runs ", custom_->num_stages, " stages on ",
                    custom_->num_workers, " workers, but this pipeline has ", num_stages,
                    " stages on ", num_workers, " workers");
}

const Schedule& ScheduleCache::get(int64_t num_microbatches) {
  auto it = schedules_.find(num_microbatches);
  if (it != schedules_.end()) return it->second;
  TORCH_CHECK_VALUE(!custom_ || custom_->num_microbatches == num_microbatches,
                    "the custom schedule has ", custom_ ? custom_->num_microbatches : 0,
                    " micro-batches, but this step has ", num_microbatches,
                    " (chunks, or fewer where the batch is smaller)");
  const int64_t least = min_microbatches(kind_, num_stages_);
  TORCH_CHECK_VALUE(custom_ || least == 1 || num_microbatches >= least, "schedule ", kind_,
                    " needs at least ", least, " micro-batches on ", num_stages_,
                    " stages, but this step has ", num_microbatches,
                    " (chunks, or fewer where the batch is smaller)");
  Schedule s =
      custom_ ? *custom_ : make_schedule(kind_, num_workers_, num_stages_, num_microbatches);
  const int64_t capacity = queue_capacity_ > 0 ? queue_capacity_ : num_microbatches;
  validate(s, ValidateOptions().queue_capacity(capacity));
  return schedules_.emplace(num_microbatches, std::move(s)).first->second;
}

const Schedule& ScheduleCache::forward_only(int64_t num_microbatches) {
  auto it = forward_only_.find(num_microbatches);
  if (it != forward_only_.end()) return it->second;
  Schedule s = get(num_microbatches);
  for (auto& actions : s.actions) {
    std::vector<Action> kept;
    for (const auto& a : actions) {
      if (a.kind == ActionKind::kForward || a.kind == ActionKind::kSendActivation ||
          a.kind == ActionKind::kRecvActivation) {
        kept.push_back(a);
      }
    }
    actions = std::move(kept);
  }
  validate(s, ValidateOptions().forward_only(true));
  return forward_only_.emplace(num_microbatches, std::move(s)).first->second;
}

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

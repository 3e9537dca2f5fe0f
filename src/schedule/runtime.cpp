#include "gpipe/schedule/runtime.h"

#include "split.h"

#include "gpipe/schedule/run_actions.h"
#include "gpipe/schedule/thread_transport.h"
#include "gpipe/schedule/validate.h"
#include "gpipe/skip/layout.h"
#include "gpipe/skip/skippable.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <exception>
#include <numeric>
#include <thread>
#include <utility>

namespace gpipe {
namespace schedule {

std::ostream& operator<<(std::ostream& out, LossReduction reduction) {
  switch (reduction) {
    case LossReduction::kMean:
      return out << "mean";
    case LossReduction::kSum:
      return out << "sum";
  }
  return out << "LossReduction(" << static_cast<int>(reduction) << ")";
}

PipelineScheduleOptions::PipelineScheduleOptions(int64_t chunks) : chunks_(chunks) {}

PipelineSchedule::PipelineSchedule(std::vector<torch::nn::Sequential> stages, LossFunction loss,
                                   PipelineScheduleOptions options)
    : loss_(std::move(loss)), options_(std::move(options)) {
  const int64_t S = static_cast<int64_t>(stages.size());
  TORCH_CHECK_VALUE(S > 0, "a pipeline needs at least one stage");
  TORCH_CHECK_VALUE(static_cast<bool>(loss_), "the loss function is empty");
  TORCH_CHECK_VALUE(options_.chunks() > 0, "chunks must be positive, but got ", options_.chunks());
  TORCH_CHECK_VALUE(options_.stages_per_worker() > 0,
                    "stages_per_worker must be positive, but got ", options_.stages_per_worker());
  TORCH_CHECK_VALUE(options_.intra_op_threads() >= 0,
                    "intra_op_threads must be non-negative, but got ", options_.intra_op_threads());
  TORCH_CHECK_VALUE(options_.queue_capacity() >= 0, "queue_capacity must be non-negative, but got ",
                    options_.queue_capacity());
  TORCH_CHECK_VALUE(S % options_.stages_per_worker() == 0, "stages_per_worker (",
                    options_.stages_per_worker(), ") must divide the number of stages (", S, ")");
  TORCH_CHECK_VALUE(options_.stages_per_worker() == 1 ||
                        options_.schedule() == ScheduleKind::kInterleavedOneFOneB,
                    "schedule ", options_.schedule(),
                    " runs one stage per worker, but stages_per_worker is ",
                    options_.stages_per_worker());
  // The checkpoint's recomputation runs inside one autograd node, which has no split point
  // between the input's and the parameters' gradients.
  TORCH_CHECK_VALUE(options_.checkpoint() == CheckpointMode::kNever ||
                        options_.schedule() != ScheduleKind::kZeroBubble,
                    "schedule ", options_.schedule(),
                    " splits each backward into input and weight gradients, which checkpoint "
                    "cannot: use checkpoint with gpipe, 1f1b or interleaved_1f1b");
  num_workers_ = S / options_.stages_per_worker();
  auto devices = options_.devices();
  if (devices.empty()) devices.assign(S, c10::Device(c10::kCPU));
  TORCH_CHECK_INDEX(static_cast<int64_t>(devices.size()) >= S, "too few devices for ", S,
                    " stages (devices: ", devices.size(), ")");
  for (const auto s : c10::irange(S)) {
    TORCH_CHECK_VALUE(stages[s] && !stages[s]->is_empty(), "stage ", s, " has no layers");
    stages[s]->to(devices[s]);
    stages_.push_back(
        std::make_unique<Stage>(s, S, std::move(stages[s]), devices[s], options_.checkpoint()));
  }
  verify_skips_within_stages();
  // Fails early for a schedule that cannot run these stages.
  plan(1);
}

void PipelineSchedule::verify_skips_within_stages() const {
  // Portals carry skips between GPipe's partitions; stages here keep theirs to themselves.
  std::vector<torch::nn::Sequential> modules;
  for (const auto& stage : stages_) modules.push_back(stage->module());
  const skip::SkipLayout layout = skip::inspect_skip_layout(modules);
  for (const auto s : c10::irange(modules.size())) {
    for (const auto& route : layout.stashed_in(s)) {
      TORCH_CHECK_VALUE(route.pop_partition == s, "skip '", route.key.second,
                        "' is stashed in stage ", s, " and popped in stage ", route.pop_partition,
                        ", but explicit schedules carry skip connections only within a stage");
    }
    skip::verify_skippables(modules[s]);
  }
}

PipelineSchedule::PipelineSchedule(const torch::nn::Sequential& module,
                                   const std::vector<int64_t>& balance, LossFunction loss,
                                   PipelineScheduleOptions options)
    : PipelineSchedule(detail::split_by_balance(module, balance), std::move(loss),
                       std::move(options)) {}

Schedule PipelineSchedule::schedule(int64_t num_microbatches) {
  std::lock_guard<std::mutex> lock(mutex_);
  return plan(num_microbatches);
}

const Schedule& PipelineSchedule::plan(int64_t num_microbatches) {
  auto it = schedules_.find(num_microbatches);
  if (it != schedules_.end()) return it->second;
  Schedule s = make_schedule(options_.schedule(), num_workers_, num_stages(), num_microbatches);
  const int64_t capacity =
      options_.queue_capacity() > 0 ? options_.queue_capacity() : num_microbatches;
  validate(s, ValidateOptions().queue_capacity(capacity));
  return schedules_.emplace(num_microbatches, std::move(s)).first->second;
}

torch::nn::Sequential& PipelineSchedule::stage_module(int64_t index) {
  TORCH_CHECK_INDEX(index >= 0 && index < num_stages(), "stage ", index, " is out of range for ",
                    num_stages(), " stages");
  return stages_[index]->module();
}

int64_t PipelineSchedule::max_live_microbatches(int64_t index) const {
  TORCH_CHECK_INDEX(index >= 0 && index < num_stages(), "stage ", index, " is out of range for ",
                    num_stages(), " stages");
  return stages_[index]->max_live_microbatches();
}

void PipelineSchedule::run_worker(int64_t worker, const Schedule& schedule,
                                  const std::vector<Batch>& inputs,
                                  const std::vector<Batch>& targets,
                                  const std::vector<double>& scales,
                                  std::vector<at::Tensor>& losses, Transport& transport) {
  if (options_.intra_op_threads() > 0) {
    // Initialize first, or LibTorch's lazy initialization would later overwrite this thread's
    // count with the last one any thread set.
    at::internal::lazy_init_num_threads();
    at::set_num_threads(static_cast<int>(options_.intra_op_threads()));
  }
  trace::UseTracer use_tracer(options_.tracer().get(), worker, steps_);
  std::vector<Stage*> stages;
  for (auto& stage : stages_) stages.push_back(stage.get());
  run_actions(schedule.actions[worker], stages, transport,
              StepInputs{inputs, targets, scales, loss_}, losses);
}

at::Tensor PipelineSchedule::step(const Batch& input, const Batch& target) {
  std::lock_guard<std::mutex> lock(mutex_);
  check(input);
  check(target);
  const int64_t N = input[0].size(0);
  TORCH_CHECK_VALUE(target[0].size(0) == N, "input and target must have the same batch size, but ",
                    "the input has ", N, " and the target ", target[0].size(0));
  const std::vector<Batch> inputs = scatter(input, options_.chunks());
  const std::vector<Batch> targets = scatter(target, options_.chunks());
  const int64_t M = static_cast<int64_t>(inputs.size());
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(targets.size()) == M);
  std::vector<double> scales(M, 1.0);
  if (options_.loss_reduction() == LossReduction::kMean) {
    for (const auto i : c10::irange(M)) {
      scales[i] = static_cast<double>(inputs[i][0].size(0)) / static_cast<double>(N);
    }
  }
  const Schedule& chosen = plan(M);
  ThreadTransport transport(num_stages(),
                            options_.queue_capacity() > 0 ? options_.queue_capacity() : M);
  for (auto& stage : stages_) {
    stage->reset_live_peak();
    stage->set_num_microbatches(M);
  }

  std::vector<at::Tensor> losses(M);
  std::mutex error_mutex;
  std::exception_ptr error;  // the first failure, guarded by error_mutex
  std::vector<std::thread> threads;
  for (const auto w : c10::irange(num_workers_)) {
    threads.emplace_back([&, w] {
      try {
        run_worker(w, chosen, inputs, targets, scales, losses, transport);
      } catch (...) {
        {
          std::lock_guard<std::mutex> guard(error_mutex);
          if (!error) error = std::current_exception();
        }
        transport.abort();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ++steps_;
  if (error) {
    for (auto& stage : stages_) stage->clear();
    std::rethrow_exception(error);
  }
  at::Tensor total = losses[0];
  for (const auto i : c10::irange(1, M)) total = total + losses[i];
  return total;
}

}  // namespace schedule
}  // namespace gpipe

#include "gpipe/schedule/runtime.h"

#include "detail/caller_state.h"
#include "detail/split.h"
#include "schedule/engine.h"
#include "schedule/gradient_norm.h"
#include "schedule/pipeline_parameters.h"
#include "schedule/run_actions.h"
#include "schedule/set_aside_gradients.h"
#include "schedule/tied_gradients.h"

#include "gpipe/amp/grad_scaler.h"
#include "gpipe/memory.h"
#include "gpipe/schedule/thread_transport.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/nn/utils/clip_grad.h>

#include <exception>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

namespace gpipe {
namespace schedule {

PipelineScheduleOptions::PipelineScheduleOptions(int64_t chunks)
    : ScheduleOptions(chunks, /*intra_op_threads=*/1) {}

PipelineSchedule::PipelineSchedule(std::vector<torch::nn::Sequential> stages, LossFunction loss,
                                   PipelineScheduleOptions options)
    : loss_(std::move(loss)), options_(std::move(options)) {
  const int64_t S = static_cast<int64_t>(stages.size());
  TORCH_CHECK_VALUE(S > 0, "a pipeline needs at least one stage");
  TORCH_CHECK_VALUE(static_cast<bool>(loss_), "the loss function is empty");
  options_.check("worker");
  TORCH_CHECK_VALUE(options_.queue_capacity() >= 0, "queue_capacity must be non-negative, but got ",
                    options_.queue_capacity());
  if (const auto& custom = options_.custom_schedule()) {
    num_workers_ = custom->num_workers;
  } else {
    TORCH_CHECK_VALUE(S % options_.stages_per_worker() == 0, "stages_per_worker (",
                      options_.stages_per_worker(), ") must divide the number of stages (", S, ")");
    num_workers_ = S / options_.stages_per_worker();
  }
  auto devices = options_.devices();
  if (devices.empty()) devices.assign(S, c10::Device(c10::kCPU));
  TORCH_CHECK_INDEX(static_cast<int64_t>(devices.size()) >= S, "too few devices for ", S,
                    " stages (devices: ", devices.size(), ")");
  for (const auto s : c10::irange(S)) {
    TORCH_CHECK_VALUE(stages[s] && !stages[s]->is_empty(), "stage ", s, " has no layers");
  }
  const skip::SkipLayout skips = detail::verify_skips(stages);
  const auto parameters = gpipe::detail::pipeline_parameters(stages);
  gpipe::detail::check_tied_devices(parameters, devices);
  parameters_ = gpipe::detail::tensors_of(parameters);
  std::vector<at::Tensor> tied;
  for (const auto& p : parameters) {
    if (p.tied()) tied.push_back(p.tensor);
  }
  for (const auto s : c10::irange(S)) {
    stages[s]->to(devices[s]);
    stages_.push_back(std::make_unique<Stage>(s, S, std::move(stages[s]), devices[s],
                                              options_.checkpoint(), &skips));
  }
  if (!tied.empty()) {
    tied_gradients_ = std::make_unique<gpipe::detail::TiedGradients>(std::move(tied), num_workers_);
  }
  schedules_ = std::make_unique<detail::ScheduleCache>(
      options_.schedule(), num_workers_, S, options_.queue_capacity(), options_.custom_schedule());
  // Fails early for a schedule that cannot run these stages.
  schedules_->prepare();
}

PipelineSchedule::PipelineSchedule(const torch::nn::Sequential& module,
                                   const std::vector<int64_t>& balance, LossFunction loss,
                                   PipelineScheduleOptions options)
    : PipelineSchedule(gpipe::detail::split_by_balance(module, balance), std::move(loss),
                       std::move(options)) {}

PipelineSchedule::~PipelineSchedule() = default;

Schedule PipelineSchedule::schedule(int64_t num_microbatches) {
  std::lock_guard<std::mutex> lock(mutex_);
  return schedules_->get(num_microbatches);
}

torch::nn::Sequential& PipelineSchedule::stage_module(int64_t index) {
  TORCH_CHECK_INDEX(index >= 0 && index < num_stages(), "stage ", index, " is out of range for ",
                    num_stages(), " stages");
  return stages_[index]->module();
}

int64_t PipelineSchedule::peak_live_microbatches(int64_t index) const {
  TORCH_CHECK_INDEX(index >= 0 && index < num_stages(), "stage ", index, " is out of range for ",
                    num_stages(), " stages");
  return stages_[index]->peak_live_microbatches();
}

void PipelineSchedule::run_worker(int64_t worker, const Schedule& schedule, const StepInputs& step,
                                  std::vector<at::Tensor>& losses, Transport& transport) {
  if (options_.intra_op_threads() > 0) {
    // Initialize first, or LibTorch's lazy initialization would later overwrite this thread's
    // count with the last one any thread set.
    at::internal::lazy_init_num_threads();
    at::set_num_threads(static_cast<int>(options_.intra_op_threads()));
  }
  trace::UseTracer use_tracer(options_.tracer().get(), worker, steps_);
  std::optional<memory::ScopedWorkerTag> tag;
  if (worker < memory::kMaxTags) tag.emplace(worker);
  std::vector<Stage*> stages(stages_.size(), nullptr);
  for (const auto s : c10::irange(stages_.size())) {
    if (schedule.worker_of(s) == worker) stages[s] = stages_[s].get();
  }
  run_actions(schedule.actions[worker], stages, transport, step, losses);
}

void PipelineSchedule::run_workers(const Schedule& schedule, const StepInputs& step,
                                   std::vector<at::Tensor>& losses, int64_t queue_capacity) {
  ThreadTransport transport(num_stages(), queue_capacity);
  const gpipe::detail::CallerState caller;
  std::mutex error_mutex;
  std::exception_ptr error;  // the first failure, guarded by error_mutex
  std::vector<std::thread> threads;
  for (const auto w : c10::irange(num_workers_)) {
    threads.emplace_back([&, w] {
      try {
        gpipe::detail::UseCallerState caller_state(caller);
        std::optional<gpipe::detail::TiedGradients::UseWorker> worker;
        if (tied_gradients_) worker.emplace(*tied_gradients_, w);
        run_worker(w, schedule, step, losses, transport);
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
    if (tied_gradients_) tied_gradients_->discard();
    std::rethrow_exception(error);
  }
}

at::Tensor PipelineSchedule::step(const Batch& input, const Batch& target) {
  std::lock_guard<std::mutex> lock(mutex_);
  detail::check_training_mode();
  const detail::StepBatches batches =
      detail::split_step(input, &target, options_.chunks(), options_.loss_reduction());
  const int64_t M = batches.size();
  const Schedule& chosen = schedules_->get(M);
  const auto& scaler = options_.grad_scaler();
  for (auto& stage : stages_) stage->begin_step(M, scaler ? scaler->scale() : 1.0);
  std::vector<at::Tensor> losses(M);
  {
    // With a scaler, the step's own gradients are unscaled and checked.
    gpipe::detail::SetAsideGradients accumulated(scaler ? parameters_ : std::vector<at::Tensor>{});
    run_workers(chosen, batches.with(loss_), losses,
                options_.queue_capacity() > 0 ? options_.queue_capacity() : M);
    if (tied_gradients_) tied_gradients_->finish();
    if (scaler) scaler->unscale(parameters_);
  }
  return detail::total_loss(losses);
}

Evaluation PipelineSchedule::evaluate(const Batch& input) { return run_evaluation(input, nullptr); }

Evaluation PipelineSchedule::evaluate(const Batch& input, const Batch& target) {
  return run_evaluation(input, &target);
}

Evaluation PipelineSchedule::run_evaluation(const Batch& input, const Batch* target) {
  std::lock_guard<std::mutex> lock(mutex_);
  const detail::StepBatches batches =
      detail::split_step(input, target, options_.chunks(), options_.loss_reduction());
  const int64_t M = batches.size();
  const Schedule& chosen = schedules_->forward_only(M);
  for (auto& stage : stages_) stage->begin_step(M);
  std::vector<at::Tensor> losses(M);
  std::vector<Batch> outputs(M, Batch(at::Tensor()));
  StepInputs step = batches.with(loss_);
  step.outputs = &outputs;
  run_workers(chosen, step, losses, M);
  Evaluation result;
  result.output = gather(outputs);
  if (target != nullptr) result.loss = detail::total_loss(losses);
  return result;
}

std::vector<at::Tensor> PipelineSchedule::parameters() const { return parameters_; }

double PipelineSchedule::clip_grad_norm(double max_norm, double norm_type,
                                        bool error_if_nonfinite) {
  gpipe::detail::check_clip_options(max_norm, norm_type);
  return torch::nn::utils::clip_grad_norm_(parameters_, max_norm, norm_type, error_if_nonfinite);
}

}  // namespace schedule
}  // namespace gpipe

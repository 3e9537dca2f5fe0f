#include "plan/calibration.h"

#include "balance/module_state_guard.h"
#include "gpipe/balance/block_partition.h"
#include "gpipe/schedule/predict.h"
#include "gpipe/schedule/runtime.h"
#include "gpipe/trace.h"

#include <c10/util/irange.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>

namespace gpipe {
namespace plan_detail {
namespace {

void scale(const Calibration& calibration, LayerCosts& layer) {
  layer.forward *= calibration.forward;
  layer.backward *= calibration.backward;
  layer.backward_input *= calibration.backward;
  layer.backward_weight *= calibration.backward;
}

}  // namespace

at::Tensor half_squares(const Batch& output, const Batch& /*target*/) {
  at::Tensor loss;
  for (const auto& y : output.tensors()) {
    if (!y.defined() || !y.is_floating_point()) continue;
    const at::Tensor half = 0.5 * y.pow(2).sum();
    loss = loss.defined() ? loss + half : half;
  }
  TORCH_CHECK_VALUE(loss.defined(), "the model's output has no floating-point tensor to calibrate ",
                    "the planner's profile with a loss");
  return loss;
}

std::vector<Calibration> calibrate(torch::nn::Sequential model, const Batch& sample,
                                   const Batch& target, const schedule::LossFunction& loss,
                                   int64_t workers, int64_t threads, int64_t cores,
                                   const std::map<int64_t, ModelCosts>& profiles, int64_t steps) {
  // One GPipe pipeline per micro-batch count, each cut where its profile balances time.
  struct Run {
    int64_t microbatches;
    const ModelCosts* costs;
    std::vector<int64_t> balance = {};
    std::shared_ptr<trace::Tracer> tracer = std::make_shared<trace::Tracer>();
    std::unique_ptr<schedule::PipelineSchedule> pipeline = nullptr;
  };
  const balance::ModuleStateGuard restore(model.ptr());
  model->train(true);
  torch::AutoGradMode grad_mode(true);
  std::vector<Run> runs;
  for (const auto& [microbatches, costs] : profiles) {
    Run run{microbatches, &costs};
    const std::vector<LayerCosts>& layers = costs.layers;
    std::vector<int64_t> time;
    for (const auto& layer : layers) {
      time.push_back(static_cast<int64_t>(1e9 * (layer.forward + layer.backward)));
    }
    run.balance = balance::block_partition(
        time, std::min<int64_t>(workers, static_cast<int64_t>(layers.size())));
    run.pipeline =
        std::make_unique<schedule::PipelineSchedule>(model, run.balance, loss,
                                                     schedule::PipelineScheduleOptions(microbatches)
                                                         .schedule(schedule::ScheduleKind::kGPipe)
                                                         .intra_op_threads(threads)
                                                         .tracer(run.tracer));
    run.pipeline->step(sample, target);  // warm up
    run.tracer->clear();
    runs.push_back(std::move(run));
  }
  // Round by round, so that a drifting machine's speed falls on every count alike.
  for (int64_t k = 0; k < steps; ++k) {
    for (auto& run : runs) run.pipeline->step(sample, target);
  }

  std::vector<Calibration> calibrations;
  for (const auto& run : runs) {
    const int64_t stages = static_cast<int64_t>(run.balance.size());
    const schedule::ActionCosts measured =
        schedule::costs_from_trace(run.tracer->events(), stages, cores);
    // The last stage's forward ran the loss, and its backward started there.
    double forward = 0, backward = 0;
    double profiled_forward = run.costs->loss.forward, profiled_backward = run.costs->loss.backward;
    int64_t layer = 0;
    for (const auto s : c10::irange(stages)) {
      forward += measured.forward[s];
      backward += measured.backward[s];
      for (int64_t k = 0; k < run.balance[s]; ++k, ++layer) {
        profiled_forward += run.costs->layers[layer].forward;
        profiled_backward += run.costs->layers[layer].backward;
      }
    }
    Calibration calibration;
    calibration.microbatches = run.microbatches;
    if (profiled_forward > 0) calibration.forward = forward / profiled_forward;
    if (profiled_backward > 0) calibration.backward = backward / profiled_backward;
    calibrations.push_back(calibration);
  }
  return calibrations;
}

void apply(const Calibration& calibration, ModelCosts& costs) {
  for (auto& layer : costs.layers) scale(calibration, layer);
  scale(calibration, costs.loss);
}

}  // namespace plan_detail
}  // namespace gpipe

#include "plan/layer_costs.h"

#include "balance/layer_sandbox.h"
#include "gpipe/memory.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <string>

namespace gpipe {
namespace plan_detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point begin, Clock::time_point end) {
  return std::chrono::duration<double>(end - begin).count();
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

int64_t bytes_of(const Batch& batch) {
  int64_t bytes = 0;
  for (const auto& tensor : batch.tensors()) {
    if (tensor.defined()) bytes += static_cast<int64_t>(tensor.nbytes());
  }
  return bytes;
}

std::vector<at::Tensor> carrying_gradients(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& tensor : tensors) {
    if (tensor.defined() && tensor.requires_grad()) out.push_back(tensor);
  }
  return out;
}

}  // namespace

std::vector<LayerCosts> profile_layer_costs(torch::nn::Sequential model, const Batch& microbatch,
                                            int64_t repetitions) {
  TORCH_CHECK_VALUE(repetitions >= 1, "repetitions must be positive (repetitions: ", repetitions,
                    ")");
  TORCH_CHECK_VALUE(microbatch.size() > 0, "the sample has no tensor");
  balance::check_no_gradients(model);
  const c10::Device device = balance::memory_profiling_device(microbatch);
  const Batch input = balance::to_device(microbatch, device);
  const auto names = model->named_children().keys();
  torch::AutoGradMode grad_mode(true);

  const size_t layers = model->size();
  std::vector<LayerCosts> costs(layers);
  std::vector<std::vector<double>> forward(layers), backward_input(layers), backward_weight(layers);
  for (int64_t pass = 0; pass < repetitions; ++pass) {
    Batch batch = input;
    auto layer = model->begin();
    for (const auto k : c10::irange(layers)) {
      balance::LayerSandbox sandbox(k, names[k], *layer++, device);
      balance::detach(batch);
      // A stage receives its input as a tensor that carries gradients, the first one excepted.
      if (k > 0) {
        for (const auto j : c10::irange(batch.size())) {
          if (batch[j].is_floating_point()) batch[j].requires_grad_(true);
        }
      }
      const std::vector<at::Tensor> inputs = carrying_gradients(batch.tensors());
      costs[k].input_bytes = bytes_of(batch);
      costs[k].parameter_bytes = balance::parameter_bytes(sandbox.sequential());

      balance::synchronize(device);
      const int64_t before = memory::current_bytes(device);
      auto tick = Clock::now();
      Batch output = batch.call(sandbox.sequential(), "layer " + std::to_string(k));
      balance::synchronize(device);
      forward[k].push_back(seconds_between(tick, Clock::now()));
      if (pass == 0) {
        costs[k].activation_bytes = std::max<int64_t>(memory::current_bytes(device) - before, 0);
      }

      const std::vector<at::Tensor> outputs = carrying_gradients(output.tensors());
      std::vector<at::Tensor> gradients;
      for (const auto& y : outputs) gradients.push_back(y.detach());
      const std::vector<at::Tensor> parameters =
          carrying_gradients(sandbox.sequential()->parameters());
      if (!outputs.empty() && !inputs.empty()) {
        tick = Clock::now();
        torch::autograd::grad(outputs, inputs, gradients, /*retain_graph=*/true,
                              /*create_graph=*/false, /*allow_unused=*/true);
        balance::synchronize(device);
        backward_input[k].push_back(seconds_between(tick, Clock::now()));
      }
      if (!outputs.empty() && !parameters.empty()) {
        tick = Clock::now();
        torch::autograd::grad(outputs, parameters, gradients, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
        balance::synchronize(device);
        backward_weight[k].push_back(seconds_between(tick, Clock::now()));
      }
      batch = std::move(output);
    }
  }
  for (const auto k : c10::irange(layers)) {
    costs[k].forward = median(forward[k]);
    costs[k].backward_input = median(backward_input[k]);
    costs[k].backward_weight = median(backward_weight[k]);
  }
  return costs;
}

}  // namespace plan_detail
}  // namespace gpipe

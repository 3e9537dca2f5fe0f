#include "gpipe/balance/profile.h"

#include "balance/layer_sandbox.h"
#include "detail/stream.h"
#include "gpipe/memory.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

namespace gpipe {
namespace balance {
namespace {

int64_t median(std::vector<int64_t> values) {
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

}  // namespace

std::vector<int64_t> profile_times(torch::nn::Sequential module, const Batch& sample,
                                   const BalanceByTimeOptions& options) {
  TORCH_CHECK_VALUE(options.timeout() >= 0,
                    "timeout must be non-negative (timeout: ", options.timeout(), ")");
  TORCH_CHECK_VALUE(options.repetitions() >= 1,
                    "repetitions must be positive (repetitions: ", options.repetitions(), ")");
  TORCH_CHECK_VALUE(sample.size() > 0, "the sample has no tensor");
  check_no_gradients(module);
  const c10::Device device =
      gpipe::detail::normalize_device(options.device().value_or(sample[0].device()));
  const Batch input = to_device(sample, device);
  const auto names = module->named_children().keys();
  torch::AutoGradMode grad_mode(true);

  using Clock = std::chrono::steady_clock;
  const auto begun = Clock::now();
  const auto timeout = std::chrono::duration<double>(options.timeout());
  std::vector<std::vector<int64_t>> times(module->size());
  for (int64_t pass = 0; pass < options.repetitions() || Clock::now() - begun < timeout; ++pass) {
    Batch batch = input;  // every pass starts from the sample
    auto layer = module->begin();
    for (const auto k : c10::irange(module->size())) {
      LayerSandbox sandbox(k, names[k], *layer++, device);
      detach(batch);
      synchronize(device);
      const auto tick = Clock::now();

      batch = batch.call(sandbox.sequential(), "layer " + std::to_string(k));
      std::vector<at::Tensor> outputs;
      std::vector<at::Tensor> gradients;
      for (const auto& output : batch) {
        if (!output.requires_grad()) continue;
        outputs.push_back(output);
        gradients.push_back(output.detach());
      }
      if (!outputs.empty()) torch::autograd::backward(outputs, gradients);

      synchronize(device);
      const auto tock = Clock::now();
      times[k].push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(tock - tick).count());
    }
  }

  std::vector<int64_t> costs;
  costs.reserve(times.size());
  for (auto& samples : times) costs.push_back(median(std::move(samples)));
  return costs;
}

std::vector<int64_t> profile_sizes(torch::nn::Sequential module, const Batch& sample,
                                   const BalanceBySizeOptions& options) {
  TORCH_CHECK_VALUE(options.chunks() >= 1,
                    "number of chunks must be positive integer (chunks: ", options.chunks(), ")");
  TORCH_CHECK_VALUE(options.param_scale() >= 0,
                    "param_scale must be non-negative (param_scale: ", options.param_scale(), ")");
  check(sample);
  const c10::Device device = memory_profiling_device(sample);
  Batch batch = to_device(scatter(sample, options.chunks())[0], device);
  const auto names = module->named_children().keys();
  torch::AutoGradMode grad_mode(true);

  std::vector<int64_t> sizes;
  auto layer = module->begin();
  for (const auto k : c10::irange(module->size())) {
    LayerSandbox sandbox(k, names[k], *layer++, device);
    detach(batch);

    const int64_t before = memory::current_bytes(device);
    batch = batch.call(sandbox.sequential(), "layer " + std::to_string(k));
    const int64_t latent = std::max<int64_t>(memory::current_bytes(device) - before, 0);

    const auto parameters = static_cast<double>(parameter_bytes(sandbox.sequential()));
    sizes.push_back(latent + static_cast<int64_t>(parameters * options.param_scale()));
  }
  return sizes;
}

}  // namespace balance
}  // namespace gpipe

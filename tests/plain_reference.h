// The plain model's results that the training recipes' tests compare the engines with: a plain
// Sequential trained on the same micro-batches, one after another, as PyTorch's recipes train
// it (autocast around the forward and the loss, backward outside).
#pragma once

#include "distributed_model.h"
#include "test_util.h"

#include "gpipe/amp/autocast.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace gpipe {
namespace testing {

/// The loss and each parameter's gradient (model.parameters() order) of one step.
struct PlainStep {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
};

/// One step of `model` on `input` split into `chunks` micro-batches, each loss scaled by its share
/// of the batch (LossReduction::kMean) and differentiated on its own; each forward and loss
/// under autocast in `dtype` on the input's device type where `autocast` (CPU bfloat16 by
/// default). Leaves the gradients in `model`.
inline PlainStep plain_step(torch::nn::Sequential& model, const torch::Tensor& input,
                            const torch::Tensor& target, int64_t chunks, bool autocast = false,
                            c10::ScalarType dtype = torch::kBFloat16) {
  const auto inputs = input.chunk(chunks);
  const auto targets = target.chunk(chunks);
  const double N = static_cast<double>(input.size(0));
  PlainStep step;
  for (size_t i = 0; i < inputs.size(); ++i) {
    torch::Tensor loss;
    {
      amp::Autocast scope(input.device().type(), dtype, autocast);
      loss = torch::mse_loss(model->forward(inputs[i]), targets[i]) *
             (static_cast<double>(inputs[i].size(0)) / N);
    }
    loss.backward();
    step.loss = step.loss.defined() ? step.loss + loss.detach() : loss.detach();
  }
  for (const auto& p : model->parameters()) step.grads.push_back(p.grad().clone());
  return step;
}

/// What the recording model's layers saw (distributed_model.h), recomputations left out, and
/// whether any was a recomputation; clears the log.
inline std::map<int64_t, std::set<std::string>> take_dtype_log(bool* recomputed = nullptr) {
  std::lock_guard<std::mutex> lock(dtype_log_mutex());
  std::map<int64_t, std::set<std::string>> seen;
  const std::string suffix = " (recomputed)";
  if (recomputed != nullptr) *recomputed = false;
  for (const auto& [layer, whats] : dtype_log()) {
    for (std::string what : whats) {
      if (what.size() > suffix.size() &&
          what.compare(what.size() - suffix.size(), suffix.size(), suffix) == 0) {
        what.resize(what.size() - suffix.size());
        if (recomputed != nullptr) *recomputed = true;
      }
      seen[layer].insert(what);
    }
  }
  dtype_log().clear();
  return seen;
}

/// Each tensor of `tensors` once, in order: a model's parameters with a tied one once
/// (Module::parameters() lists it once per module that registers it).
inline std::vector<torch::Tensor> unique(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> result;
  for (const auto& t : tensors) {
    bool seen = false;
    for (const auto& r : result) seen = seen || r.is_same(t);
    if (!seen) result.push_back(t);
  }
  return result;
}

/// The largest difference of `actual` from `expected`, relative to the largest magnitude in
/// `expected`.
inline double relative_difference(const torch::Tensor& actual, const torch::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  const double difference = (actual.to(expected.dtype()) - expected).abs().max().item<double>();
  return scale > 0 ? difference / scale : difference;
}

}  // namespace testing
}  // namespace gpipe

#include "gpipe/schedule/stage.h"

#include "gpipe/checkpoint.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {

Stage::Stage(int64_t index, int64_t num_stages, torch::nn::Sequential module, c10::Device device,
             bool checkpoint)
    : index_(index),
      num_stages_(num_stages),
      module_(std::move(module)),
      device_(device),
      checkpoint_(checkpoint) {
  TORCH_CHECK_INDEX(index >= 0 && index < num_stages, "stage index ", index,
                    " is out of range for ", num_stages, " stages");
}

Batch Stage::prepare_input(const Batch& input) const {
  std::vector<at::Tensor> tensors;
  tensors.reserve(input.size());
  for (const auto& x : input) {
    at::Tensor y = x.to(device_);
    if (!is_first()) {
      // Cut the graph here: the gradient of this leaf is what goes back upstream.
      y = y.detach();
      if (y.is_floating_point() || y.is_complex()) y.requires_grad_(true);
    }
    tensors.push_back(std::move(y));
  }
  Batch batch = input;
  batch.set_tensors(std::move(tensors));
  return batch;
}

Batch Stage::run(const Batch& input) {
  const std::string what = "stage " + std::to_string(index_);
  if (!checkpoint_) return input.call(module_, what);
  return gpipe::checkpoint([this, what](const Batch& x) { return x.call(module_, what); }, input);
}

void Stage::keep(int64_t microbatch, Pending pending) {
  TORCH_CHECK_VALUE(pending_.count(microbatch) == 0, "stage ", index_,
                    " already holds micro-batch ", microbatch);
  pending_.emplace(microbatch, std::move(pending));
  max_live_ = std::max(max_live_, static_cast<int64_t>(pending_.size()));
}

Batch Stage::forward(int64_t microbatch, const Batch& input) {
  TORCH_INTERNAL_ASSERT(!is_last());
  Batch prepared = prepare_input(input);
  Batch output = run(prepared);
  std::vector<at::Tensor> detached;
  detached.reserve(output.size());
  for (const auto& y : output) detached.push_back(y.detach());
  Batch sent = output;
  sent.set_tensors(std::move(detached));
  keep(microbatch, Pending{std::move(prepared), std::move(output)});
  return sent;
}

at::Tensor Stage::forward_loss(int64_t microbatch, const Batch& input, const Batch& target,
                               const LossFunction& loss, double scale) {
  TORCH_INTERNAL_ASSERT(is_last());
  Batch prepared = prepare_input(input);
  Batch output = run(prepared);
  std::vector<at::Tensor> targets;
  for (const auto& t : target) targets.push_back(t.to(device_));
  Batch moved = target;
  moved.set_tensors(std::move(targets));
  at::Tensor value = loss(output, moved);
  TORCH_CHECK_VALUE(value.defined() && value.numel() == 1,
                    "the loss function must return a scalar, but returned a tensor of shape ",
                    value.defined() ? value.sizes() : at::IntArrayRef{});
  at::Tensor scaled = scale == 1.0 ? value.reshape({}) : value.reshape({}) * scale;
  keep(microbatch, Pending{std::move(prepared), Batch(scaled)});
  return scaled.detach();
}

Batch Stage::backward(int64_t microbatch, const Batch& grad_output) {
  auto it = pending_.find(microbatch);
  TORCH_CHECK_VALUE(it != pending_.end(), "stage ", index_, " has no forward of micro-batch ",
                    microbatch, " to backward");
  Pending pending = std::move(it->second);
  pending_.erase(it);

  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> grads;
  if (is_last()) {
    if (pending.output[0].requires_grad()) outputs.push_back(pending.output[0]);
  } else {
    TORCH_CHECK_VALUE(grad_output.size() == pending.output.size(), "stage ", index_,
                      " got gradients of ", grad_output.size(), " tensors for micro-batch ",
                      microbatch, ", but its output has ", pending.output.size());
    for (const auto k : c10::irange(pending.output.size())) {
      const at::Tensor& y = pending.output.tensors()[k];
      const at::Tensor& g = grad_output.tensors()[k];
      if (!y.requires_grad() || !g.defined()) continue;
      outputs.push_back(y);
      grads.push_back(g.to(y.device()));
    }
  }
  if (!outputs.empty()) torch::autograd::backward(outputs, grads);
  if (is_first()) return Batch(std::vector<at::Tensor>{});

  std::vector<at::Tensor> grad_input;
  for (const auto& x : pending.input) {
    grad_input.push_back(x.requires_grad() ? x.grad() : at::Tensor());
  }
  Batch result = pending.input;
  result.set_tensors(std::move(grad_input));
  return result;
}

void Stage::clear() { pending_.clear(); }

}  // namespace schedule
}  // namespace gpipe

#include "gpipe/schedule/stage.h"

#include "schedule/scaled_loss.h"
#include "schedule/split_backward.h"

#include "gpipe/batchnorm.h"
#include "gpipe/checkpoint.h"
#include "gpipe/skip/tracker.h"
#include "gpipe/trace.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {

struct Stage::Pending {
  Batch input;
  Batch output;              // the scaled loss on the last stage
  SkipTensors popped = {};   // leaves, like the input's
  SkipTensors stashed = {};  // in the graph, like the output
  // Set by backward_input(): where backward_weight() starts, and with which gradients.
  bool input_done = false;
  detail::WeightRoots weight = {};
};

namespace {

// Runs a stage's `module` on `input` and the tensors of the skip lane: with a skip tracker of its
// own, holding `popped` (what earlier stages stashed) under the keys of `pops`; sets `stashed` to
// what the layers stashed under the keys of `stashes`, for later stages. `what` names the stage
// in errors.
Batch call_with_skip_lane(torch::nn::Sequential& module, const Batch& input,
                          const std::vector<skip::SkipRoute>& pops, const SkipTensors& popped,
                          const std::vector<skip::SkipRoute>& stashes, SkipTensors* stashed,
                          const std::string& what) {
  auto tracker = std::make_shared<skip::SkipTracker>();
  for (const auto k : c10::irange(pops.size())) tracker->save(pops[k].key, popped[k]);
  Batch output = [&] {
    skip::UseSkipTracker use(tracker);
    return input.call(module, what);
  }();
  stashed->clear();
  for (const auto& route : stashes) {
    auto it = tracker->tensors().find(route.key);
    TORCH_CHECK(it != tracker->tensors().end(), what, " did not stash '", route.key.second,
                "', which stage ", route.pop_stage, " pops");
    stashed->push_back(it->second);
  }
  return output;
}

std::vector<at::Tensor> detached(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> result;
  result.reserve(tensors.size());
  for (const auto& x : tensors) result.push_back(x.defined() ? x.detach() : x);
  return result;
}

}  // namespace

Stage::Stage(int64_t index, int64_t num_stages, torch::nn::Sequential module, c10::Device device,
             CheckpointMode checkpoint, const skip::SkipLayout* skips)
    : index_(index),
      num_stages_(num_stages),
      module_(std::move(module)),
      device_(device),
      checkpoint_(checkpoint) {
  TORCH_CHECK_INDEX(index >= 0 && index < num_stages, "stage index ", index,
                    " is out of range for ", num_stages, " stages");
  deferred_batch_norms_ = gpipe::deferred_batch_norms(*module_);
  if (skips == nullptr) return;
  TORCH_CHECK_VALUE(static_cast<int64_t>(skips->num_partitions()) == num_stages,
                    "the skip layout has ", skips->num_partitions(), " stages, but the pipeline ",
                    num_stages);
  for (const auto& route : skips->popped_in(index)) {
    if (static_cast<int64_t>(route.stash_stage) != index) skip_pops_.push_back(route);
  }
  for (const auto& route : skips->stashed_in(index)) {
    if (static_cast<int64_t>(route.pop_stage) != index) skip_stashes_.push_back(route);
  }
  std::sort(skip_stashes_.begin(), skip_stashes_.end(), [](const auto& a, const auto& b) {
    return std::tie(a.pop_stage, a.key) < std::tie(b.pop_stage, b.key);
  });
}

Stage::~Stage() = default;

void Stage::begin_step(int64_t num_microbatches, double loss_scale) {
  TORCH_CHECK_VALUE(num_microbatches > 0, "a step needs at least one micro-batch, but got ",
                    num_microbatches);
  num_microbatches_ = num_microbatches;
  loss_scale_ = loss_scale;
  peak_live_ = static_cast<int64_t>(pending_.size());
  if (module_->is_training()) {
    for (const auto& deferred : deferred_batch_norms_) deferred->begin_minibatch(num_microbatches);
  }
}

Batch Stage::on_device(const Batch& input) const {
  std::vector<at::Tensor> tensors;
  tensors.reserve(input.size());
  for (const auto& x : input) tensors.push_back(x.defined() ? x.to(device_) : x);
  Batch batch = input;
  batch.set_tensors(std::move(tensors));
  return batch;
}

Batch Stage::prepare_input(const Batch& input) const {
  std::vector<at::Tensor> tensors;
  tensors.reserve(input.size());
  for (const auto& x : input) {
    if (!x.defined()) {  // a skip may stash nothing
      tensors.push_back(x);
      continue;
    }
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

Stage::Pending Stage::run(int64_t microbatch, const Batch& input, const SkipTensors& popped) {
  TORCH_CHECK_VALUE(popped.size() == skip_pops_.size(), "stage ", index_, " pops ",
                    skip_pops_.size(), " skip(s) of earlier stages, but got ", popped.size(),
                    " tensor(s) for micro-batch ", microbatch);
  Pending pending{prepare_input(input), Batch(std::vector<at::Tensor>{})};
  // Popped tensors are cut like the input: their gradients go back to the stashing stage.
  pending.popped = prepare_input(Batch(popped)).tensors();
  const std::string what = "stage " + std::to_string(index_);
  const bool last = microbatch == num_microbatches_ - 1;
  if (checkpoint_ == CheckpointMode::kNever ||
      (checkpoint_ == CheckpointMode::kExceptLast && last)) {
    pending.output = call_with_skip_lane(module_, pending.input, skip_pops_, pending.popped,
                                         skip_stashes_, &pending.stashed, what);
    return pending;
  }
  // Skips cross the checkpoint as more inputs and outputs, so that their gradients flow through
  // the recomputation. The recomputation holds the module, not the stage: it may outlive both.
  // It runs inside the backward's span, on the backward's thread.
  const bool skips = !skip_pops_.empty() || !skip_stashes_.empty();
  std::vector<at::Tensor> inputs = pending.input.tensors();
  inputs.insert(inputs.end(), pending.popped.begin(), pending.popped.end());
  auto output_atomic = std::make_shared<bool>(true);
  const Batch outputs = gpipe::checkpoint(
      [module = module_, what, stage = index_, microbatch, pops = skip_pops_,
       stashes = skip_stashes_, num_inputs = pending.input.size(),
       input_atomic = pending.input.atomic(), skips, output_atomic](const Batch& x) mutable {
        std::optional<trace::TraceSpan> span;
        if (is_recomputing()) span.emplace("recompute", stage, microbatch);
        SkipTensors stashed;
        if (!skips) return call_with_skip_lane(module, x, {}, {}, {}, &stashed, what);
        const auto& tensors = x.tensors();
        const auto split = tensors.begin() + static_cast<std::ptrdiff_t>(num_inputs);
        const Batch in = input_atomic ? Batch(tensors[0])
                                      : Batch(std::vector<at::Tensor>(tensors.begin(), split));
        const Batch out = call_with_skip_lane(module, in, pops, SkipTensors(split, tensors.end()),
                                              stashes, &stashed, what);
        *output_atomic = out.atomic();
        std::vector<at::Tensor> result = out.tensors();
        result.insert(result.end(), stashed.begin(), stashed.end());
        return Batch(std::move(result));
      },
      skips ? Batch(std::move(inputs)) : pending.input);
  if (!skips) {
    pending.output = outputs;
    return pending;
  }
  const auto& tensors = outputs.tensors();
  const size_t num_outputs = tensors.size() - skip_stashes_.size();
  pending.output =
      *output_atomic
          ? Batch(tensors[0])
          : Batch(std::vector<at::Tensor>(tensors.begin(), tensors.begin() + num_outputs));
  pending.stashed.assign(tensors.begin() + num_outputs, tensors.end());
  return pending;
}

void Stage::keep(int64_t microbatch, Pending pending) {
  TORCH_CHECK_VALUE(pending_.count(microbatch) == 0, "stage ", index_,
                    " already holds micro-batch ", microbatch);
  pending_.emplace(microbatch, std::make_unique<Pending>(std::move(pending)));
  peak_live_ = std::max(peak_live_, static_cast<int64_t>(pending_.size()));
}

Batch Stage::forward(int64_t microbatch, const Batch& input, const SkipTensors& popped,
                     SkipTensors* stashed) {
  TORCH_INTERNAL_ASSERT(!is_last());
  TORCH_INTERNAL_ASSERT(stashed != nullptr || skip_stashes_.empty());
  Pending pending = run(microbatch, input, popped);
  Batch sent = pending.output;
  sent.set_tensors(detached(pending.output.tensors()));
  if (stashed != nullptr) *stashed = detached(pending.stashed);
  keep(microbatch, std::move(pending));
  return sent;
}

at::Tensor Stage::loss(const Batch& output, const Batch& target, const LossFunction& loss,
                       double scale) const {
  return detail::scaled_loss(loss(output, on_device(target)), scale);
}

at::Tensor Stage::forward_loss(int64_t microbatch, const Batch& input, const Batch& target,
                               const LossFunction& loss, double scale, const SkipTensors& popped) {
  TORCH_INTERNAL_ASSERT(is_last());
  Pending pending = run(microbatch, input, popped);
  at::Tensor scaled = this->loss(pending.output, target, loss, scale);
  pending.output = Batch(scaled);
  keep(microbatch, std::move(pending));
  return scaled.detach();
}

Batch Stage::forward_only(int64_t microbatch, const Batch& input, const SkipTensors& popped,
                          SkipTensors* stashed) {
  TORCH_CHECK_VALUE(popped.size() == skip_pops_.size(), "stage ", index_, " pops ",
                    skip_pops_.size(), " skip(s) of earlier stages, but got ", popped.size(),
                    " tensor(s) for micro-batch ", microbatch);
  at::NoGradGuard no_grad;
  SkipTensors stashed_here;
  Batch output =
      call_with_skip_lane(module_, on_device(input), skip_pops_, on_device(Batch(popped)).tensors(),
                          skip_stashes_, &stashed_here, "stage " + std::to_string(index_));
  if (stashed != nullptr) *stashed = std::move(stashed_here);
  return output;
}

Stage::Pending& Stage::find_pending(int64_t microbatch, const char* what) {
  auto it = pending_.find(microbatch);
  TORCH_CHECK_VALUE(it != pending_.end(), "stage ", index_, " has no forward of micro-batch ",
                    microbatch, " to ", what);
  return *it->second;
}

void Stage::backward_roots(int64_t microbatch, const Pending& pending, const Batch& grad_output,
                           const SkipTensors& stashed_grads, std::vector<at::Tensor>* outputs,
                           std::vector<at::Tensor>* grads) const {
  TORCH_CHECK_VALUE(stashed_grads.size() == pending.stashed.size(), "stage ", index_, " got ",
                    stashed_grads.size(), " skip gradient(s) for micro-batch ", microbatch,
                    ", but it stashed ", pending.stashed.size(), " tensor(s) for later stages");
  for (const auto k : c10::irange(pending.stashed.size())) {
    const at::Tensor& y = pending.stashed[k];
    const at::Tensor& g = stashed_grads[k];
    if (!y.defined() || !y.requires_grad() || !g.defined()) continue;
    outputs->push_back(y);
    grads->push_back(g.to(y.device()));
  }
  if (is_last()) {
    if (pending.output[0].requires_grad()) {
      outputs->push_back(pending.output[0]);
      grads->push_back(at::full_like(pending.output[0], loss_scale_));
    }
    return;
  }
  TORCH_CHECK_VALUE(grad_output.size() == pending.output.size(), "stage ", index_,
                    " got gradients of ", grad_output.size(), " tensors for micro-batch ",
                    microbatch, ", but its output has ", pending.output.size());
  for (const auto k : c10::irange(pending.output.size())) {
    const at::Tensor& y = pending.output.tensors()[k];
    const at::Tensor& g = grad_output.tensors()[k];
    if (!y.requires_grad() || !g.defined()) continue;
    outputs->push_back(y);
    grads->push_back(g.to(y.device()));
  }
}

Batch Stage::backward(int64_t microbatch, const Batch& grad_output,
                      const SkipTensors& stashed_grads, SkipTensors* popped_grads) {
  Pending& found = find_pending(microbatch, "backward");
  TORCH_CHECK_VALUE(!found.input_done, "stage ", index_,
                    " already ran backward_input of micro-batch ", microbatch,
                    "; finish it with backward_weight");
  const std::unique_ptr<Pending> pending = std::move(pending_.at(microbatch));
  pending_.erase(microbatch);

  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> grads;
  backward_roots(microbatch, *pending, grad_output, stashed_grads, &outputs, &grads);
  if (!outputs.empty()) torch::autograd::backward(outputs, grads);
  if (popped_grads != nullptr) {
    popped_grads->clear();
    for (const auto& x : pending->popped) {
      popped_grads->push_back(x.defined() && x.requires_grad() ? x.grad() : at::Tensor());
    }
  }
  if (is_first()) return Batch(std::vector<at::Tensor>{});

  std::vector<at::Tensor> grad_input;
  for (const auto& x : pending->input) {
    grad_input.push_back(x.requires_grad() ? x.grad() : at::Tensor());
  }
  Batch result = pending->input;
  result.set_tensors(std::move(grad_input));
  return result;
}

Batch Stage::backward_input(int64_t microbatch, const Batch& grad_output,
                            const SkipTensors& stashed_grads, SkipTensors* popped_grads) {
  Pending& pending = find_pending(microbatch, "backward_input");
  TORCH_CHECK_VALUE(!pending.input_done, "stage ", index_,
                    " already ran backward_input of micro-batch ", microbatch);
  if (popped_grads != nullptr) popped_grads->clear();
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> grads;
  backward_roots(microbatch, pending, grad_output, stashed_grads, &outputs, &grads);
  pending.input_done = true;
  if (is_first()) {
    // Nothing to send upstream: the whole backward is weight gradient.
    detail::backward_input(outputs, grads, /*leaves=*/{}, &pending.weight);
    return Batch(std::vector<at::Tensor>{});
  }
  // The popped tensors' gradients go upstream like the input's.
  std::vector<at::Tensor> leaves = pending.input.tensors();
  leaves.insert(leaves.end(), pending.popped.begin(), pending.popped.end());
  std::vector<at::Tensor> leaf_grads =
      detail::backward_input(outputs, grads, leaves, &pending.weight);
  const auto split = leaf_grads.begin() + static_cast<std::ptrdiff_t>(pending.input.size());
  Batch grad_input = pending.input;
  grad_input.set_tensors(std::vector<at::Tensor>(leaf_grads.begin(), split));
  if (popped_grads != nullptr) popped_grads->assign(split, leaf_grads.end());
  return grad_input;
}

void Stage::backward_weight(int64_t microbatch) {
  const Pending& found = find_pending(microbatch, "backward_weight");
  TORCH_CHECK_VALUE(found.input_done, "stage ", index_,
                    " has not run backward_input of micro-batch ", microbatch,
                    " before backward_weight");
  const std::unique_ptr<Pending> pending = std::move(pending_.at(microbatch));
  pending_.erase(microbatch);
  detail::backward_weight(pending->weight);
}

void Stage::clear() { pending_.clear(); }

}  // namespace schedule
}  // namespace gpipe

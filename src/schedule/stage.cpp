#include "gpipe/schedule/stage.h"

#include "gpipe/batchnorm.h"
#include "gpipe/checkpoint.h"
#include "gpipe/trace.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {

Stage::Stage(int64_t index, int64_t num_stages, torch::nn::Sequential module, c10::Device device,
             CheckpointMode checkpoint)
    : index_(index),
      num_stages_(num_stages),
      module_(std::move(module)),
      device_(device),
      checkpoint_(checkpoint) {
  TORCH_CHECK_INDEX(index >= 0 && index < num_stages, "stage index ", index,
                    " is out of range for ", num_stages, " stages");
  deferred_batch_norms_ = detail::deferred_batch_norms(*module_);
}

void Stage::begin_step(int64_t num_microbatches) {
  TORCH_CHECK_VALUE(num_microbatches > 0, "a step needs at least one micro-batch, but got ",
                    num_microbatches);
  num_microbatches_ = num_microbatches;
  max_live_ = static_cast<int64_t>(pending_.size());
  if (module_->is_training()) {
    for (const auto& deferred : deferred_batch_norms_) deferred->begin_minibatch(num_microbatches);
  }
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

Batch Stage::run(int64_t microbatch, const Batch& input) {
  const std::string what = "stage " + std::to_string(index_);
  const bool last = microbatch == num_microbatches_ - 1;
  if (checkpoint_ == CheckpointMode::kNever ||
      (checkpoint_ == CheckpointMode::kExceptLast && last)) {
    return input.call(module_, what);
  }
  // The recomputation holds the module, not the stage: it may outlive both. It runs inside the
  // backward's span, on the backward's thread.
  return gpipe::checkpoint(
      [module = module_, what, stage = index_, microbatch](const Batch& x) mutable {
        std::optional<trace::TraceSpan> span;
        if (is_recomputing()) span.emplace("recompute", stage, microbatch);
        return x.call(module, what);
      },
      input);
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
  Batch output = run(microbatch, prepared);
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
  Batch output = run(microbatch, prepared);
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

Stage::Pending& Stage::find_pending(int64_t microbatch, const char* what) {
  auto it = pending_.find(microbatch);
  TORCH_CHECK_VALUE(it != pending_.end(), "stage ", index_, " has no forward of micro-batch ",
                    microbatch, " to ", what);
  return it->second;
}

void Stage::backward_roots(int64_t microbatch, const Pending& pending, const Batch& grad_output,
                           std::vector<at::Tensor>* outputs, std::vector<at::Tensor>* grads) const {
  if (is_last()) {
    if (pending.output[0].requires_grad()) {
      outputs->push_back(pending.output[0]);
      grads->push_back(at::ones_like(pending.output[0]));
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

Batch Stage::backward(int64_t microbatch, const Batch& grad_output) {
  Pending& found = find_pending(microbatch, "backward");
  TORCH_CHECK_VALUE(!found.input_done, "stage ", index_,
                    " already ran backward_input of micro-batch ", microbatch,
                    "; finish it with backward_weight");
  Pending pending = std::move(found);
  pending_.erase(microbatch);

  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> grads;
  backward_roots(microbatch, pending, grad_output, &outputs, &grads);
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

namespace {

using torch::autograd::Edge;
using torch::autograd::Node;

// Which of the graph's nodes lead to the stage input, and which to a parameter (any leaf other
// than the input), found by one depth-first walk from the roots.
struct Reach {
  bool input = false;
  bool weight = false;
};

std::unordered_map<Node*, Reach> reach_from(const torch::autograd::edge_list& roots,
                                            const std::unordered_set<Node*>& input_nodes) {
  std::unordered_map<Node*, Reach> reach;
  std::vector<std::pair<Node*, size_t>> stack;  // (node, next child to visit)
  for (const Edge& root : roots) {
    if (!root.is_valid() || reach.count(root.function.get())) continue;
    reach[root.function.get()];
    stack.emplace_back(root.function.get(), 0);
    while (!stack.empty()) {
      Node* node = stack.back().first;
      const size_t child = stack.back().second++;
      if (child < node->num_outputs()) {
        const Edge& next = node->next_edge(child);
        if (next.is_valid() && !reach.count(next.function.get())) {
          reach[next.function.get()];
          stack.emplace_back(next.function.get(), 0);
        }
        continue;
      }
      stack.pop_back();
      Reach& r = reach[node];
      if (input_nodes.count(node)) {
        r.input = true;
      } else if (dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
        r.weight = true;
      }
      for (const Edge& next : node->next_edges()) {
        if (!next.is_valid()) continue;
        const Reach& c = reach[next.function.get()];
        r.input = r.input || c.input;
        r.weight = r.weight || c.weight;
      }
    }
  }
  return reach;
}

// The gradients of `input`, one per tensor (undefined where none), from the captured gradients of
// those that require grad, in order.
Batch input_gradients(const Batch& input, const std::vector<at::Tensor>& captured) {
  std::vector<at::Tensor> grad_input;
  size_t next = 0;
  for (const auto& x : input) {
    grad_input.push_back(x.requires_grad() ? captured[next++] : at::Tensor());
  }
  Batch result = input;
  result.set_tensors(std::move(grad_input));
  return result;
}

}  // namespace

Batch Stage::backward_input(int64_t microbatch, const Batch& grad_output) {
  Pending& pending = find_pending(microbatch, "backward_input");
  TORCH_CHECK_VALUE(!pending.input_done, "stage ", index_,
                    " already ran backward_input of micro-batch ", microbatch);
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> grads;
  backward_roots(microbatch, pending, grad_output, &outputs, &grads);
  pending.input_done = true;
  torch::autograd::edge_list roots;
  for (const auto& y : outputs) roots.push_back(torch::autograd::impl::gradient_edge(y));
  if (is_first()) {
    // Nothing to send upstream: the whole backward is weight gradient.
    pending.weight_roots = std::move(roots);
    pending.weight_grads = std::move(grads);
    return Batch(std::vector<at::Tensor>{});
  }

  torch::autograd::edge_list input_edges;
  std::unordered_set<Node*> input_nodes;
  for (const auto& x : pending.input) {
    if (!x.requires_grad()) continue;
    input_edges.push_back(torch::autograd::impl::gradient_edge(x));
    input_nodes.insert(input_edges.back().function.get());
  }
  const auto reach = reach_from(roots, input_nodes);
  const auto weight_only = [&](const Edge& e) {
    if (!e.is_valid()) return false;
    const Reach& r = reach.at(e.function.get());
    return r.weight && !r.input;
  };

  // Split points: nodes on the input's path with a child only on a parameter's path. A root off
  // the input's path starts a weight pass of its own.
  std::vector<std::shared_ptr<Node>> splits;
  for (const auto& entry : reach) {
    Node* node = entry.first;
    if (!entry.second.input) continue;
    const auto& next = node->next_edges();
    if (std::none_of(next.begin(), next.end(), weight_only)) continue;
    splits.push_back(node->shared_from_this());
  }
  // In the order they were recorded, latest first, so that runs are repeatable.
  std::sort(splits.begin(), splits.end(),
            [](const auto& a, const auto& b) { return a->sequence_nr() > b->sequence_nr(); });
  torch::autograd::edge_list captures = input_edges;
  for (const auto& node : splits) {
    for (const auto k : c10::irange(node->num_inputs())) {
      captures.emplace_back(node, static_cast<uint32_t>(k));
    }
  }
  for (const auto k : c10::irange(roots.size())) {
    if (!reach.at(roots[k].function.get()).input) {
      pending.weight_roots.push_back(roots[k]);
      pending.weight_grads.push_back(grads[k]);
    }
  }

  std::vector<at::Tensor> captured;
  if (!roots.empty() && !captures.empty()) {
    captured = torch::autograd::Engine::get_default_engine().execute(
        roots, grads, /*keep_graph=*/true, /*create_graph=*/false, /*accumulate_grad=*/false,
        captures);
  } else {
    captured.resize(captures.size());
  }
  for (const auto k : c10::irange(input_edges.size(), captures.size())) {
    if (!captured[k].defined()) continue;
    pending.weight_roots.push_back(captures[k]);
    pending.weight_grads.push_back(captured[k]);
  }
  // The input's path is done: free what only it needed, then cut it, so that backward_weight()
  // from the split points runs only towards the parameters. Release before cutting: a cut drops
  // the last owner of the nodes behind it, and `reach` holds raw pointers to them.
  const std::unordered_set<Node*> kept = [&] {
    std::unordered_set<Node*> nodes;
    for (const auto& node : splits) nodes.insert(node.get());
    return nodes;
  }();
  for (const auto& entry : reach) {
    if (entry.second.input && !kept.count(entry.first)) entry.first->release_variables();
  }
  for (const auto& node : splits) {
    for (auto& next : node->next_edges()) {
      if (!weight_only(next)) next = Edge();
    }
  }
  return input_gradients(pending.input, captured);
}

void Stage::backward_weight(int64_t microbatch) {
  Pending& found = find_pending(microbatch, "backward_weight");
  TORCH_CHECK_VALUE(found.input_done, "stage ", index_,
                    " has not run backward_input of micro-batch ", microbatch,
                    " before backward_weight");
  Pending pending = std::move(found);
  pending_.erase(microbatch);
  if (pending.weight_roots.empty()) return;
  torch::autograd::Engine::get_default_engine().execute(
      pending.weight_roots, pending.weight_grads, /*keep_graph=*/false, /*create_graph=*/false,
      /*accumulate_grad=*/true);
}

void Stage::clear() { pending_.clear(); }

}  // namespace schedule
}  // namespace gpipe

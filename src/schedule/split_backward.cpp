#include "schedule/split_backward.h"

#include <c10/util/irange.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace gpipe {
namespace schedule {
namespace detail {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;

// Which of the graph's nodes lead to one of the leaves (the stage's input), and which to a
// parameter (the AccumulateGrad of any other tensor), found by one depth-first walk from the
// roots.
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

}  // namespace

std::vector<at::Tensor> backward_input(const std::vector<at::Tensor>& outputs,
                                       const std::vector<at::Tensor>& grads,
                                       const std::vector<at::Tensor>& leaves, WeightRoots* weight) {
  torch::autograd::edge_list roots;
  for (const auto& y : outputs) roots.push_back(torch::autograd::impl::gradient_edge(y));
  if (leaves.empty()) {
    *weight = WeightRoots{std::move(roots), grads};
    return {};
  }
  *weight = WeightRoots{};
  torch::autograd::edge_list input_edges;
  std::unordered_set<Node*> input_nodes;
  for (const auto& x : leaves) {
    if (!x.defined() || !x.requires_grad()) continue;
    input_edges.push_back(torch::autograd::impl::gradient_edge(x));
    input_nodes.insert(input_edges.back().function.get());
  }
  const auto reach = reach_from(roots, input_nodes);
  const auto weight_only = [&](const Edge& e) {
    if (!e.is_valid()) return false;
    const Reach& r = reach.at(e.function.get());
    return r.weight && !r.input;
  };

  // Split points: nodes on the leaves' path with a child only on a parameter's path. A root off
  // the leaves' path starts a weight pass of its own.
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
      weight->edges.push_back(roots[k]);
      weight->grads.push_back(grads[k]);
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
    weight->edges.push_back(captures[k]);
    weight->grads.push_back(captured[k]);
  }
  // The leaves' path is done: free what only it needed, then cut it, so that the weight half
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
  // The captured gradients of the leaves that require grad come first, in order.
  std::vector<at::Tensor> result;
  size_t next = 0;
  for (const auto& x : leaves) {
    result.push_back(x.defined() && x.requires_grad() ? captured[next++] : at::Tensor());
  }
  return result;
}

void backward_weight(const WeightRoots& roots) {
  if (roots.edges.empty()) return;
  torch::autograd::Engine::get_default_engine().execute(
      roots.edges, roots.grads, /*keep_graph=*/false, /*create_graph=*/false,
      /*accumulate_grad=*/true);
}

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

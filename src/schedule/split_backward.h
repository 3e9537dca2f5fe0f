// Split backward (zero-bubble schedules): a backward cut into its input half, whose result the
// previous stage waits for, and its weight half, which can wait (stage.h: backward_input and
// backward_weight).
//
// The split points are the autograd nodes where the path to a leaf (the stage's input) and a
// parameter's path part, e.g. a Linear's AddmmBackward. One depth-first walk from the roots finds
// which nodes lead to a leaf and which to a parameter; the input half runs the graph towards the
// leaves only, capturing the gradient that reaches each split point, then releases what only the
// leaves' path needed and cuts that path off, so that the weight half runs from the split points
// (and from any root off the leaves' path) towards the parameters only.
//
// Internal to Stage. Thread safety: one thread at a time per graph.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>

#include <vector>

namespace gpipe {
namespace schedule {
namespace detail {

/// Where the weight half of a backward starts: edges of the graph and the gradients that flow
/// into them.
struct WeightRoots {
  torch::autograd::edge_list edges;
  std::vector<at::Tensor> grads;
};

/// The input half of the backward of `outputs` with gradients `grads` (one each): returns the
/// gradient of each of `leaves`, undefined for one that is undefined or does not require grad,
/// and sets `weight` to where the weight half starts; the parameters' gradients are left to it.
/// Without leaves (the first stage: nothing goes upstream) it computes nothing and the weight
/// half is the whole backward. REQUIRES: every output requires grad.
std::vector<at::Tensor> backward_input(const std::vector<at::Tensor>& outputs,
                                       const std::vector<at::Tensor>& grads,
                                       const std::vector<at::Tensor>& leaves, WeightRoots* weight);

/// The weight half: accumulates the parameters' gradients from `roots` and frees the graph.
void backward_weight(const WeightRoots& roots);

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

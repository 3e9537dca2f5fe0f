// Which outputs of gpipe's autograd functions carry gradients: the floating-point and complex
// ones. The others (indices, masks) are marked non-differentiable, and callers see them detached.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

namespace gpipe {
namespace detail {

inline bool differentiable(const at::Tensor& x) { return x.is_floating_point() || x.is_complex(); }

inline void mark_non_differentiable(torch::autograd::AutogradContext* ctx,
                                    const torch::autograd::variable_list& outputs) {
  torch::autograd::variable_list non_differentiable;
  for (const auto& y : outputs) {
    if (!differentiable(y)) non_differentiable.push_back(y);
  }
  if (!non_differentiable.empty()) ctx->mark_non_differentiable(non_differentiable);
}

}  // namespace detail
}  // namespace gpipe

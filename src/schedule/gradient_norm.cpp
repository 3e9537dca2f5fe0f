#include "schedule/gradient_norm.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace gpipe {
namespace detail {

void check_clip_options(double max_norm, double norm_type) {
  TORCH_CHECK_VALUE(max_norm >= 0, "max_norm must be non-negative, but got ", max_norm);
  TORCH_CHECK_VALUE(norm_type >= 0, "norm_type must be non-negative, but got ", norm_type);
}

at::Tensor gradient_norm(const at::Tensor& grad, double norm_type) {
  if (norm_type == std::numeric_limits<double>::infinity()) return grad.abs().max();
  return grad.norm(norm_type);
}

at::Tensor total_norm(const std::vector<at::Tensor>& norms, double norm_type) {
  TORCH_INTERNAL_ASSERT(!norms.empty());
  if (norm_type == std::numeric_limits<double>::infinity()) {
    return norms.size() == 1 ? norms[0] : at::max(at::stack(norms));
  }
  if (norm_type == 0) return at::full({}, static_cast<double>(norms.size()));
  return norms.size() == 1 ? norms[0] : at::stack(norms).norm(norm_type);
}

double clip_gradients(const std::vector<at::Tensor>& grads, const at::Tensor& total,
                      double max_norm, double norm_type, bool error_if_nonfinite) {
  const double value = total.item<double>();
  // clip_grad_norm_'s message.
  TORCH_CHECK(!error_if_nonfinite || std::isfinite(value), "The total norm of order ", norm_type,
              " for gradients from `parameters` is non-finite, so it cannot be clipped. To "
              "disable this error and scale the gradients with the non-finite norm anyway, set "
              "`error_if_nonfinite=false`");
  const at::Tensor coefficient = at::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (const auto& grad : grads) grad.mul_(coefficient.to(grad.device()));
  return value;
}

}  // namespace detail
}  // namespace gpipe

// The gradient norm of a whole pipeline, computed as torch::nn::utils::clip_grad_norm_ computes
// that of the plain model: each parameter's gradient reduced to one number (its norm of
// norm_type; its largest magnitude for infinity), then those numbers reduced in the model's
// order. Across ranks, each parameter's number comes from the rank that owns it, exactly (a
// float64 sum with zeros), and every rank reduces the same numbers in the same order: the total
// is bitwise the plain model's for the same gradients (its final reduction runs on the CPU).
//
// Internal to the engines.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace gpipe {
namespace detail {

/// Throws c10::ValueError for a negative or NaN max_norm or norm_type.
void check_clip_options(double max_norm, double norm_type);

/// A gradient's number as clip_grad_norm_ takes it: a scalar of its dtype, on its device.
at::Tensor gradient_norm(const at::Tensor& grad, double norm_type);

/// The total of `norms`, one per parameter with a gradient in the model's order, as
/// clip_grad_norm_ reduces them (for norm_type 0: how many there are). REQUIRES: !norms.empty().
at::Tensor total_norm(const std::vector<at::Tensor>& norms, double norm_type);

/// Multiplies `grads` by clip_grad_norm_'s coefficient for `total`, min(1, max_norm / (total +
/// 1e-6)), and returns the total. With error_if_nonfinite, throws c10::Error for a total that is
/// not finite, as clip_grad_norm_ does, before changing anything.
double clip_gradients(const std::vector<at::Tensor>& grads, const at::Tensor& total,
                      double max_norm, double norm_type, bool error_if_nonfinite);

}  // namespace detail
}  // namespace gpipe

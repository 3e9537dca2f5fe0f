// A loss function's value as a stage keeps it for backward: one rule for the stages that train
// (Stage::loss) and for the planner that profiles them (plan/layer_costs.h).
#pragma once

#include <ATen/core/Tensor.h>

namespace gpipe {
namespace schedule {
namespace detail {

/// `value`, the loss function's result, as a 0-dim tensor times `scale` (left unscaled at 1).
/// A loss's scalar may be a view of a larger buffer (mse_loss's is of its input's size); the
/// scaling makes a tensor of its own and lets go of it. Throws c10::ValueError if `value` is
/// not a scalar.
at::Tensor scaled_loss(const at::Tensor& value, double scale);

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

#include "schedule/scaled_loss.h"

#include <c10/util/Exception.h>

namespace gpipe {
namespace schedule {
namespace detail {

at::Tensor scaled_loss(const at::Tensor& value, double scale) {
  TORCH_CHECK_VALUE(value.defined() && value.numel() == 1,
                    "the loss function must return a scalar, but returned a tensor of shape ",
                    value.defined() ? value.sizes() : at::IntArrayRef{});
  return scale == 1.0 ? value.reshape({}) : value.reshape({}) * scale;
}

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

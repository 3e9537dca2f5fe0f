#include "gpipe/amp/autocast.h"

#include "detail/autocast_state.h"
#include "detail/compat.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

namespace gpipe {
namespace amp {

Autocast::Autocast(c10::DeviceType device_type, c10::optional<c10::ScalarType> dtype, bool enabled,
                   bool cache_enabled)
    : device_type_(device_type) {
  TORCH_CHECK_VALUE(device_type == c10::kCPU || device_type == c10::kCUDA,
                    "autocast runs on cpu or cuda, not ", device_type);
  const c10::ScalarType chosen = dtype ? *dtype : detail::autocast_dtype(device_type);
  TORCH_CHECK_VALUE(chosen == c10::kBFloat16 || chosen == c10::kHalf, "autocast on ", device_type,
                    " runs in BFloat16 or Half, not ", chosen);
  TORCH_CHECK_VALUE(GPIPE_LIBTORCH_2 || device_type != c10::kCPU || chosen == c10::kBFloat16,
                    "LibTorch 1.13's autocast on cpu runs in BFloat16 only, not ", chosen);
  outer_enabled_ = detail::autocast_enabled(device_type);
  outer_dtype_ = detail::autocast_dtype(device_type);
  outer_cache_enabled_ = detail::autocast_cache_enabled();
  detail::set_autocast_dtype(device_type, chosen);
  detail::set_autocast_enabled(device_type, enabled);
  detail::set_autocast_cache_enabled(cache_enabled);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // As torch.autocast's exit: the outermost scope drops the casts it cached.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  detail::set_autocast_enabled(device_type_, outer_enabled_);
  detail::set_autocast_dtype(device_type_, outer_dtype_);
  detail::set_autocast_cache_enabled(outer_cache_enabled_);
}

}  // namespace amp
}  // namespace gpipe

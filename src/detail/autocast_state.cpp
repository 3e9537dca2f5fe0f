#include "detail/autocast_state.h"

#include "detail/compat.h"

#include <ATen/autocast_mode.h>

namespace gpipe {
namespace detail {

bool autocast_enabled(c10::DeviceType device_type) {
#if GPIPE_LIBTORCH_2
  return at::autocast::is_autocast_enabled(device_type);
#else
  return device_type == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
#if GPIPE_LIBTORCH_2
  at::autocast::set_autocast_enabled(device_type, enabled);
#else
  device_type == c10::kCPU ? at::autocast::set_cpu_enabled(enabled)
                           : at::autocast::set_enabled(enabled);
#endif
}

c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
#if GPIPE_LIBTORCH_2
  return at::autocast::get_autocast_dtype(device_type);
#else
  return device_type == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                                  : at::autocast::get_autocast_gpu_dtype();
#endif
}

void set_autocast_dtype(c10::DeviceType device_type, c10::ScalarType dtype) {
#if GPIPE_LIBTORCH_2
  at::autocast::set_autocast_dtype(device_type, dtype);
#else
  device_type == c10::kCPU ? at::autocast::set_autocast_cpu_dtype(dtype)
                           : at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}

bool autocast_cache_enabled() { return at::autocast::is_autocast_cache_enabled(); }

void set_autocast_cache_enabled(bool enabled) { at::autocast::set_autocast_cache_enabled(enabled); }

AutocastState AutocastState::current() {
  AutocastState state;
  state.cpu_enabled = autocast_enabled(c10::kCPU);
  state.cpu_dtype = autocast_dtype(c10::kCPU);
  state.cuda_enabled = autocast_enabled(c10::kCUDA);
  state.cuda_dtype = autocast_dtype(c10::kCUDA);
  return state;
}

void AutocastState::apply() const {
  set_autocast_dtype(c10::kCPU, cpu_dtype);
  set_autocast_enabled(c10::kCPU, cpu_enabled);
  set_autocast_dtype(c10::kCUDA, cuda_dtype);
  set_autocast_enabled(c10::kCUDA, cuda_enabled);
}

UseAutocast::UseAutocast(const AutocastState& state)
    : outer_(AutocastState::current()), outer_cache_(autocast_cache_enabled()) {
  state.apply();
  set_autocast_cache_enabled(false);
}

UseAutocast::~UseAutocast() {
  outer_.apply();
  set_autocast_cache_enabled(outer_cache_);
}

}  // namespace detail
}  // namespace gpipe

// The autocast settings of a thread, captured where work is submitted or a forward runs, and put
// in place where it runs later or elsewhere: a worker thread, or a checkpoint's recomputation
// inside backward (torch.utils.checkpoint does the same).
//
// While gpipe computes a stage under UseAutocast, autocast's cache of weight casts is off. That
// cache keys a cast on the weight alone: a cast made by a checkpointed forward (under no-grad) has
// no gradient function, and would cut the weight's gradient for every later micro-batch that
// found it there; and a cast kept past an optimizer step would be stale. Casting again per
// micro-batch gives the same values.
//
// LibTorch 1.13 names the calls by device (set_cpu_enabled, get_autocast_gpu_dtype, ...); this
// file is the one place that knows both spellings.
//
// Thread safety: both act on the calling thread's settings only.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace gpipe {
namespace detail {

/// Per device type (CPU, CUDA): whether autocast is on, and its lower-precision dtype.
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::kHalf;

  /// The calling thread's.
  static AutocastState current();
  /// Makes it the calling thread's.
  void apply() const;
  /// True if autocast is on for any device type.
  bool any_enabled() const { return cpu_enabled || cuda_enabled; }
};

/// Autocast's settings of the calling thread for `device_type` (CPU or CUDA), and whether its
/// cache of weight casts is on.
bool autocast_enabled(c10::DeviceType device_type);
void set_autocast_enabled(c10::DeviceType device_type, bool enabled);
c10::ScalarType autocast_dtype(c10::DeviceType device_type);
void set_autocast_dtype(c10::DeviceType device_type, c10::ScalarType dtype);
bool autocast_cache_enabled();
void set_autocast_cache_enabled(bool enabled);

/// For a scope: the calling thread runs under `state` with the cache of casts off; then its
/// own settings come back.
class UseAutocast {
 public:
  explicit UseAutocast(const AutocastState& state);
  ~UseAutocast();
  UseAutocast(const UseAutocast&) = delete;
  UseAutocast& operator=(const UseAutocast&) = delete;

 private:
  AutocastState outer_;
  bool outer_cache_;
};

}  // namespace detail
}  // namespace gpipe

// Autocast: mixed precision for a scope, as Python's `with torch.autocast(...)`, which LibTorch's
// C++ API leaves to calls that must be paired by hand.
//
// Inside the scope, the operations autocast lists (matrix products, convolutions, ...) run on
// `device_type` in its lower-precision dtype (bfloat16 on CPU, float16 on CUDA, or the one given);
// those that need range run in float32. Parameters stay float32 and receive float32 gradients.
// Scopes nest; leaving the outermost clears autocast's cache of weight casts, as Python does, so
// that no cast outlives the optimizer step that changes its weight (a C++ loop that only turns
// autocast on and off keeps stale casts).
//
// Every gpipe engine runs its stages under the autocast settings of the thread that called it,
// and a checkpoint's recomputation under those of its forward, whether backward runs inside the
// scope or not (PyTorch's recipe: backward outside).
//
// Example:
//   for (...) {
//     torch::Tensor loss;
//     {
//       gpipe::amp::Autocast autocast(torch::kCPU);  // bfloat16
//       loss = pipe.step(input, target);
//     }
//     optimizer.step();
//   }
//
// Thread safety: autocast's settings are per thread; a scope acts on the thread that makes it.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

namespace gpipe {
namespace amp {

/// Autocast on `device_type` for the lifetime of the object, then the settings before it.
class Autocast {
 public:
  /// Turns autocast on (or off, with enabled false) for `device_type` (CPU or CUDA) in `dtype`
  /// (default: the thread's current one, at first bfloat16 on CPU and float16 on CUDA), with its
  /// cache of weight casts on or off. Throws c10::ValueError for another device type, or a dtype
  /// autocast does not run there (CPU and CUDA: bfloat16 or float16; LibTorch 1.13's CPU:
  /// bfloat16).
  explicit Autocast(c10::DeviceType device_type,
                    c10::optional<c10::ScalarType> dtype = c10::nullopt, bool enabled = true,
                    bool cache_enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_type_;
  bool outer_enabled_;
  c10::ScalarType outer_dtype_;
  bool outer_cache_enabled_;
};

}  // namespace amp
}  // namespace gpipe

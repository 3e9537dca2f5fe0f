// Phony: an empty tensor that carries no data, only an edge in the autograd graph.
//
// Phonies let the pipeline add backward-ordering edges (dependency.h) and keep a Checkpoint node
// reachable by autograd when no input requires grad (checkpoint.h), at no memory cost.
//
// Thread safety: get_phony may be called from any thread; the cache is guarded by a mutex.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace gpipe {
namespace detail {

/// The cached phony for (device, requires_grad): a 0-element tensor. The same tensor is returned
/// for the same key, so callers must not modify it in place.
at::Tensor get_phony(c10::Device device, bool requires_grad);

}  // namespace detail
}  // namespace gpipe

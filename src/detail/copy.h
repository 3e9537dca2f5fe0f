// Copy and Wait: the autograd functions that move micro-batches between devices and streams.
//
// Copy moves tensors to `next`'s device while both streams are current, and in backward moves the
// gradients back to `prev`'s device. Wait makes `next` wait for the work queued on `prev`, and in
// backward the other way round. Both record the tensors on the streams that use them, so the
// caching allocator never reuses memory too early. On CPU both are exact no-ops apart from the
// autograd node they add; the pipeline skips them when both streams are CPU.
//
// Outputs that are not floating point are returned detached: they cannot carry gradients.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <vector>

namespace gpipe {
namespace detail {

/// Copies `input` from `prev`'s device to `next`'s.
std::vector<at::Tensor> copy(const std::vector<at::Tensor>& input, const c10::Stream& prev,
                             const c10::Stream& next);

/// Makes `next` wait for `prev`; returns `input` as new autograd outputs.
std::vector<at::Tensor> wait(const std::vector<at::Tensor>& input, const c10::Stream& prev,
                             const c10::Stream& next);

}  // namespace detail
}  // namespace gpipe

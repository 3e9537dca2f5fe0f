// Device-generic stream helpers: CUDA streams when LibTorch has CUDA, a placeholder stream on CPU.
//
// Every function goes through c10's device guard registry (c10::impl::getDeviceGuardImpl), so this
// file never names CUDA and the same code runs on any backend LibTorch was built with. On CPU the
// "stream" is c10's default CPU stream and waiting or recording on it does nothing, which is exact:
// CPU kernels run synchronously on the calling thread.
//
// Thread safety: every function is safe to call from any thread.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

namespace gpipe {
namespace detail {

/// The stream that kernels for `device` are queued on by the calling thread.
c10::Stream current_stream(c10::Device device);

/// The default (null) stream of `device`.
c10::Stream default_stream(c10::Device device);

/// A stream from the device's pool; on CPU the placeholder stream, since CPU has no other.
c10::Stream new_stream(c10::Device device);

/// True for the placeholder stream of CPU, on which every synchronization is a no-op.
inline bool is_cpu(const c10::Stream& stream) { return stream.device_type() == c10::kCPU; }

/// Makes `source` wait until the work queued on `target` so far completes (the meaning of
/// torch.cuda.Stream.wait_stream). A CPU source blocks the calling thread; a CPU target needs no
/// wait.
void wait_stream(const c10::Stream& source, const c10::Stream& target);

/// Tells the caching allocator that `tensor`'s memory is in use on `stream`, so it is not reused
/// before the work queued there completes. A no-op for CPU streams.
void record_stream(const at::Tensor& tensor, const c10::Stream& stream);

/// Makes `stream` current (and its device current) for the scope; free on CPU.
class UseStream {
 public:
  explicit UseStream(const c10::Stream& stream) {
    if (!is_cpu(stream)) guard_.reset_stream(stream);
  }

 private:
  c10::OptionalStreamGuard guard_;
};

/// A device with an index: "cuda" becomes "cuda:<current>"; "cpu" stays "cpu".
c10::Device normalize_device(c10::Device device);

}  // namespace detail
}  // namespace gpipe

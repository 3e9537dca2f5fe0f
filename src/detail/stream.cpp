#include "detail/stream.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace gpipe {
namespace detail {
namespace {

const c10::impl::DeviceGuardImplInterface& guard_impl(c10::DeviceType type) {
  return *c10::impl::getDeviceGuardImpl(type);
}

}  // namespace

c10::Device normalize_device(c10::Device device) {
  if (device.is_cpu()) return c10::Device(c10::kCPU);
  if (device.has_index()) return device;
  return guard_impl(device.type()).getDevice();
}

c10::Stream current_stream(c10::Device device) {
  if (device.is_cpu()) return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
  return guard_impl(device.type()).getStream(normalize_device(device));
}

c10::Stream default_stream(c10::Device device) {
  if (device.is_cpu()) return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
  return guard_impl(device.type()).getDefaultStream(normalize_device(device));
}

c10::Stream new_stream(c10::Device device) {
  if (device.is_cpu()) return default_stream(device);
  return guard_impl(device.type()).getStreamFromGlobalPool(normalize_device(device));
}

void wait_stream(const c10::Stream& source, const c10::Stream& target) {
  if (is_cpu(target)) return;  // CPU work is already complete when it returns.
  if (is_cpu(source)) {
    target.synchronize();  // The calling thread is the CPU "stream".
    return;
  }
  c10::Event event(target.device_type());
  event.record(target);
  event.block(source);
}

void record_stream(const at::Tensor& tensor, const c10::Stream& stream) {
  if (is_cpu(stream) || !tensor.defined() || tensor.device().is_cpu()) return;
  guard_impl(stream.device_type()).recordDataPtrOnStream(tensor.storage().data_ptr(), stream);
}

}  // namespace detail
}  // namespace gpipe

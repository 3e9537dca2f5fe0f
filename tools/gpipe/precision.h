// --precision of `gpipe train`: autocast around each step and evaluation, on every device type
// the stages use.
#pragma once

#include <gpipe/amp/autocast.h>

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

namespace gpipe {
namespace cli {

/// The device types of `devices` (the stages' or ranks'), each once; CPU where none is given.
std::vector<c10::DeviceType> device_types(const std::vector<c10::Device>& devices);

/// For its lifetime: nothing for "fp32"; autocast in bfloat16 ("bf16") or float16 ("fp16") on
/// each of `device_types`.
class Precision {
 public:
  /// Throws c10::ValueError where autocast cannot run the precision (amp/autocast.h).
  Precision(const std::string& precision, const std::vector<c10::DeviceType>& device_types);

 private:
  std::vector<std::unique_ptr<amp::Autocast>> scopes_;
};

}  // namespace cli
}  // namespace gpipe

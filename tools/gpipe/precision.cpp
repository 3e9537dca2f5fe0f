#include "precision.h"

#include <algorithm>

namespace gpipe {
namespace cli {

std::vector<c10::DeviceType> device_types(const std::vector<c10::Device>& devices) {
  std::vector<c10::DeviceType> types;
  for (const auto& device : devices) {
    if (std::find(types.begin(), types.end(), device.type()) == types.end()) {
      types.push_back(device.type());
    }
  }
  if (types.empty()) types.push_back(c10::kCPU);
  return types;
}

Precision::Precision(const std::string& precision,
                     const std::vector<c10::DeviceType>& device_types) {
  if (precision == "fp32") return;
  const c10::ScalarType dtype = precision == "fp16" ? c10::kHalf : c10::kBFloat16;
  for (const auto type : device_types) {
    scopes_.push_back(std::make_unique<amp::Autocast>(type, dtype));
  }
}

}  // namespace cli
}  // namespace gpipe

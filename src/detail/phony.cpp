#include "detail/phony.h"

#include <ATen/ops/empty.h>
#include <c10/core/InferenceMode.h>

#include <map>
#include <mutex>
#include <tuple>

namespace gpipe {
namespace detail {

at::Tensor get_phony(c10::Device device, bool requires_grad) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, bool>, at::Tensor> phonies;  // guarded by mutex

  std::lock_guard<std::mutex> lock(mutex);
  auto& phony = phonies[{static_cast<int>(device.type()), device.index(), requires_grad}];
  if (!phony.defined()) {
    // A phony made under inference mode could not enter autograd later.
    c10::InferenceMode normal_tensors(false);
    phony = at::empty({0}, at::TensorOptions().device(device)).set_requires_grad(requires_grad);
  }
  return phony;
}

}  // namespace detail
}  // namespace gpipe

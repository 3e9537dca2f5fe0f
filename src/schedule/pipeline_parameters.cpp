#include "schedule/pipeline_parameters.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <unordered_map>

namespace gpipe {
namespace detail {

std::vector<PipelineParameter> pipeline_parameters(
    const std::vector<torch::nn::Sequential>& stages) {
  std::vector<PipelineParameter> parameters;
  std::unordered_map<const c10::TensorImpl*, size_t> index;  // by tensor
  for (const auto s : c10::irange(stages.size())) {
    for (const auto& named : stages[s]->named_parameters()) {
      const at::Tensor& tensor = named.value();
      const auto [it, added] = index.emplace(tensor.unsafeGetTensorImpl(), parameters.size());
      if (added) {
        parameters.push_back({named.key(), tensor, {static_cast<int64_t>(s)}});
        continue;
      }
      auto& used_by = parameters[it->second].stages;
      if (used_by.back() != static_cast<int64_t>(s)) used_by.push_back(static_cast<int64_t>(s));
    }
  }
  return parameters;
}

std::vector<at::Tensor> tensors_of(const std::vector<PipelineParameter>& parameters,
                                   const std::vector<int64_t>& stages) {
  std::vector<at::Tensor> tensors;
  for (const auto& p : parameters) {
    const bool used =
        stages.empty() || std::any_of(p.stages.begin(), p.stages.end(), [&](int64_t s) {
          return std::find(stages.begin(), stages.end(), s) != stages.end();
        });
    if (used) tensors.push_back(p.tensor);
  }
  return tensors;
}

void check_tied_devices(const std::vector<PipelineParameter>& parameters,
                        const std::vector<c10::Device>& devices) {
  for (const auto& p : parameters) {
    for (const int64_t s : p.stages) {
      const c10::Device& first = devices.at(p.stages[0]);
      TORCH_CHECK_VALUE(devices.at(s) == first, "parameter '", p.name, "' is tied across stages ",
                        c10::Join(", ", p.stages), ", which must then share a device, but stage ",
                        p.stages[0], " is on ", first, " and stage ", s, " on ", devices.at(s));
    }
  }
}

}  // namespace detail
}  // namespace gpipe

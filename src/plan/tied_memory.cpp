#include "plan/tied_memory.h"

#include <c10/util/irange.h>

#include <algorithm>
#include <set>
#include <unordered_map>

namespace gpipe {
namespace plan_detail {

std::vector<TiedParameter> tied_parameters(const torch::nn::Sequential& model) {
  std::vector<TiedParameter> all;
  std::unordered_map<const c10::TensorImpl*, size_t> index;  // a tensor is one parameter
  const auto layers = model->children();
  for (const auto k : c10::irange(layers.size())) {
    for (const auto& p : layers[k]->parameters()) {
      const auto [it, added] = index.emplace(p.unsafeGetTensorImpl(), all.size());
      if (added) {
        all.push_back({{}, static_cast<int64_t>(p.nbytes()), p.numel()});
      }
      auto& held_by = all[it->second].layers;
      if (held_by.empty() || held_by.back() != static_cast<int64_t>(k)) {
        held_by.push_back(static_cast<int64_t>(k));
      }
    }
  }
  std::vector<TiedParameter> tied;
  for (auto& p : all) {
    if (p.layers.size() > 1) tied.push_back(std::move(p));
  }
  return tied;
}

int64_t tied_bytes_between_ranks(const std::vector<TiedParameter>& tied,
                                 const std::vector<int64_t>& worker_of_layer, int64_t worker) {
  int64_t bytes = 0;
  for (const auto& p : tied) {
    std::set<int64_t> workers;
    for (const int64_t k : p.layers) workers.insert(worker_of_layer.at(k));
    if (workers.size() < 2 || workers.count(worker) == 0) continue;
    const auto others = static_cast<int64_t>(workers.size()) - 1;
    bytes += others * p.numel * static_cast<int64_t>(sizeof(double)) + p.bytes;
  }
  return bytes;
}

}  // namespace plan_detail
}  // namespace gpipe

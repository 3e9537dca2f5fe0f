#include "plan/tied_memory.h"

#include "detail/split.h"
#include "schedule/pipeline_parameters.h"

#include <set>

namespace gpipe {
namespace plan_detail {

std::vector<TiedParameter> tied_parameters(const torch::nn::Sequential& model) {
  // The engines' rule for which parameters are one (a tensor wherever it appears), with each
  // layer as a stage of its own.
  const std::vector<int64_t> one_each(model->size(), 1);
  std::vector<TiedParameter> tied;
  for (const auto& p : detail::pipeline_parameters(detail::split_by_balance(model, one_each))) {
    if (p.tied()) {
      tied.push_back({p.stages, static_cast<int64_t>(p.tensor.nbytes()), p.tensor.numel()});
    }
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

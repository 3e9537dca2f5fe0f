#include "plan-sweep/ranks.h"

#include "gpipe/distributed/environment.h"
#include "gpipe/distributed/share_plans.h"

#include <torch/torch.h>

#include <chrono>

namespace gpipe {
namespace bench {

Ranks::Ranks()
    : group_(distributed::rendezvous(distributed::read_environment(), std::chrono::minutes(10))) {}

std::vector<Plan> Ranks::share(const std::function<std::vector<Plan>()>& plan_here) {
  return distributed::share_plans(group_, plan_here);
}

void Ranks::barrier() { group_.group->barrier()->wait(); }

std::vector<double> Ranks::max(std::vector<double> values) {
  if (values.empty()) return values;
  std::vector<at::Tensor> tensors{torch::tensor(values, torch::kDouble)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  group_.group->allreduce(tensors, options)->wait();
  const double* data = tensors[0].data_ptr<double>();
  return std::vector<double>(data, data + values.size());
}

std::vector<int64_t> Ranks::gather(int64_t value) {
  std::vector<at::Tensor> tensors{torch::zeros({size()}, torch::kLong)};
  tensors[0][rank()] = value;
  group_.group->allreduce(tensors)->wait();  // a sum: each rank fills its own place
  const int64_t* data = tensors[0].data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + size());
}

}  // namespace bench
}  // namespace gpipe

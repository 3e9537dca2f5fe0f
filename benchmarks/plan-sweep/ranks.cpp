#include "plan-sweep/ranks.h"

#include "gpipe/distributed/environment.h"

#include <torch/torch.h>

#include <chrono>
#include <sstream>

namespace gpipe {
namespace bench {

namespace {

constexpr const char* kPlansKey = "plan_sweep/plans";

// "ok", then per plan: schedule, stages per worker, micro-batches, checkpoint, the number of
// stages and their layers; or "error <what rank 0 threw>".
std::string encode(const std::vector<Plan>& plans) {
  std::ostringstream out;
  out << "ok";
  for (const auto& p : plans) {
    out << " " << static_cast<int>(p.schedule) << " " << p.stages_per_worker << " "
        << p.microbatches << " " << static_cast<int>(p.checkpoint) << " " << p.balance.size();
    for (const int64_t b : p.balance) out << " " << b;
  }
  return out.str();
}

std::vector<Plan> decode(const std::string& text) {
  TORCH_CHECK(text.rfind("ok", 0) == 0, "rank 0 could not plan: ", text.substr(6));
  std::istringstream in(text.substr(2));
  std::vector<Plan> plans;
  int schedule = 0, checkpoint = 0;
  Plan p;
  size_t stages = 0;
  while (in >> schedule >> p.stages_per_worker >> p.microbatches >> checkpoint >> stages) {
    p.schedule = static_cast<schedule::ScheduleKind>(schedule);
    p.checkpoint = static_cast<CheckpointMode>(checkpoint);
    p.balance.assign(stages, 0);
    for (auto& b : p.balance) in >> b;
    plans.push_back(p);
  }
  return plans;
}

}  // namespace

Ranks::Ranks()
    : group_(distributed::rendezvous(distributed::read_environment(), std::chrono::minutes(10))) {}

std::vector<Plan> Ranks::share(const std::function<std::vector<Plan>()>& plan_here) {
  if (rank() != 0) {
    const std::vector<uint8_t> bytes = group_.store->get(kPlansKey);
    return decode(std::string(bytes.begin(), bytes.end()));
  }
  std::string message;
  try {
    std::vector<Plan> plans = plan_here();
    message = encode(plans);
    group_.store->set(kPlansKey, std::vector<uint8_t>(message.begin(), message.end()));
    return plans;
  } catch (const std::exception& error) {
    message = std::string("error ") + error.what();  // the others would wait until the timeout
    group_.store->set(kPlansKey, std::vector<uint8_t>(message.begin(), message.end()));
    throw;
  }
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

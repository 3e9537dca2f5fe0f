#include "gpipe/distributed/data_parallel.h"

#include "distributed/all_reduce.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <exception>

namespace gpipe {
namespace distributed {

ReplicaGroup::ReplicaGroup(const ProcessGroup& world, int64_t pipeline_size,
                           const std::string& name, std::chrono::milliseconds timeout)
    : name_(name) {
  TORCH_CHECK_VALUE(pipeline_size > 0 && world.world_size() % pipeline_size == 0, "pipelines of ",
                    pipeline_size, " ranks do not divide WORLD_SIZE = ", world.world_size());
  for (int64_t r = world.rank() % pipeline_size; r < world.world_size(); r += pipeline_size) {
    ranks_.push_back(r);
  }
  // One group per pipeline rank, each with its own keys.
  name_ = name + "/pipeline_rank" + std::to_string(ranks_[0]);
  if (ranks_.size() > 1) group_ = new_group(world, ranks_, name_, timeout);
}

void ReplicaGroup::all_reduce(std::vector<at::Tensor*> tensors, bool average) {
  if (!group_) return;
  std::vector<at::Tensor> handles;
  for (at::Tensor* t : tensors) handles.push_back(*t);
  detail::all_reduce(*group_, handles, c10d::ReduceOp::SUM,
                     average ? static_cast<double>(size()) : 1.0,
                     c10::str("the all-reduce among replicas ", c10::Join(", ", ranks_),
                              " (group '", name_, "')"));
}

}  // namespace distributed
}  // namespace gpipe

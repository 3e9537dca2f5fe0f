#include "gpipe/distributed/data_parallel.h"

#include "detail/message_of.h"

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
  if (!group_ || tensors.empty()) return;
  std::vector<at::Tensor> flat_parts;
  for (at::Tensor* t : tensors) {
    TORCH_INTERNAL_ASSERT(t->defined(), "all_reduce needs defined tensors");
    flat_parts.push_back(t->detach().reshape({-1}).to(at::kDouble));
  }
  std::vector<at::Tensor> flat{at::cat(flat_parts)};
  try {
    group_->allreduce(flat)->wait();
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "the all-reduce among replicas ", c10::Join(", ", ranks_), " (group '",
                name_, "') failed: ", detail::message_of(error));
  }
  if (average) flat[0].div_(static_cast<double>(size()));
  int64_t at = 0;
  for (at::Tensor* t : tensors) {
    const int64_t n = t->numel();
    t->detach().copy_(flat[0].narrow(0, at, n).view(t->sizes()));
    at += n;
  }
}

}  // namespace distributed
}  // namespace gpipe

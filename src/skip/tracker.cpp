#include "gpipe/skip/tracker.h"

#include "detail/dependency.h"
#include "gpipe/checkpoint.h"

#include <c10/util/Exception.h>

#include <utility>

namespace gpipe {
namespace skip {
namespace {

thread_local std::shared_ptr<SkipTracker> current;

}  // namespace

void SkipTracker::save(const SkipKey& key, at::Tensor tensor) { tensors_[key] = std::move(tensor); }

at::Tensor SkipTracker::load(const SkipKey& key) {
  auto stashed = tensors_.find(key);
  TORCH_CHECK(stashed != tensors_.end(), "'", key.second, "' has not been stashed");
  at::Tensor tensor = std::move(stashed->second);
  tensors_.erase(stashed);
  return tensor;
}

std::shared_ptr<SkipTracker> current_skip_tracker() {
  if (!current) current = std::make_shared<SkipTracker>();
  return current;
}

UseSkipTracker::UseSkipTracker(std::shared_ptr<SkipTracker> tracker)
    : previous_(std::exchange(current, std::move(tracker))) {}

UseSkipTracker::~UseSkipTracker() { current = std::move(previous_); }

SkipTrackerThroughPortals::SkipTrackerThroughPortals(std::shared_ptr<const SkipLayout> layout)
    : layout_(std::move(layout)) {
  TORCH_INTERNAL_ASSERT(layout_ != nullptr);
}

void SkipTrackerThroughPortals::save(const SkipKey& key, at::Tensor tensor) {
  saved_.insert(key);
  if (layout_->requires_copy(key)) {
    outgoing_[key] = std::move(tensor);
  } else {
    SkipTracker::save(key, std::move(tensor));
  }
}

at::Tensor SkipTrackerThroughPortals::load(const SkipKey& key) {
  loaded_.insert(key);
  if (!layout_->requires_copy(key)) return SkipTracker::load(key);
  auto popped = incoming_.find(key);
  TORCH_CHECK(popped != incoming_.end(), "'", key.second, "' has not been stashed");
  at::Tensor tensor = std::move(popped->second);
  incoming_.erase(popped);
  return tensor;
}

void SkipTrackerThroughPortals::open(Batch& input, size_t partition) {
  outgoing_.clear();
  incoming_.clear();
  saved_.clear();
  loaded_.clear();
  for (const auto& route : layout_->copy_policy(partition)) {
    auto portal = portals_.find(route.key);
    TORCH_CHECK(portal != portals_.end(), "'", route.key.second, "' has not been stashed");
    // The fork ties PortalOrange into the main lane: its backward stores the gradient before
    // the stash partition's PortalBlue needs it.
    auto [tensor, phony] = gpipe::detail::fork(input[0]);
    input[0] = std::move(tensor);
    incoming_[route.key] = portal->second->orange(phony);
  }
}

void SkipTrackerThroughPortals::close(Batch& output, size_t partition) {
  for (const auto& route : layout_->stashed_in(partition)) {
    TORCH_CHECK(saved_.count(route.key), "'", route.key.second,
                "' must be stashed but have not (layer '", route.stash_layer, "' of partition ",
                partition, " declares it stashable)");
  }
  for (const auto& route : layout_->popped_in(partition)) {
    TORCH_CHECK(loaded_.count(route.key), "'", route.key.second,
                "' must be popped but have not (layer '", route.pop_layer, "' of partition ",
                partition, " declares it poppable)");
  }
  for (auto& [key, tensor] : outgoing_) {
    const bool defined = tensor.defined();
    auto portal = portals_.find(key);
    if (portal == portals_.end()) {
      // A checkpointed micro-batch pops the tensor twice: in forward and when recomputed.
      const int64_t tensor_life = is_checkpointing() ? 3 : 2;
      portal =
          portals_.emplace(key, c10::make_intrusive<Portal>(std::move(tensor), tensor_life)).first;
    } else {
      // Recomputing: hide the recomputed tensor for its one blue, then drop it.
      portal->second->put_tensor(std::move(tensor), 1);
    }
    at::Tensor phony = portal->second->blue();
    if (defined) output[0] = gpipe::detail::join(output[0], phony);
  }
  outgoing_.clear();
}

void SkipTrackerThroughPortals::copy(Batch& batch, const c10::Stream& prev, const c10::Stream& next,
                                     const SkipKey& key) {
  auto portal = portals_.find(key);
  TORCH_CHECK(portal != portals_.end(), "'", key.second, "' has not been stashed");
  if (!portal->second->tensor().defined()) return;
  auto [tensor, phony] = gpipe::detail::fork(batch[0]);
  batch[0] = gpipe::detail::join(tensor, portal->second->copy(prev, next, phony));
}

}  // namespace skip
}  // namespace gpipe

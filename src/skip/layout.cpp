#include "gpipe/skip/layout.h"

#include "gpipe/skip/skippable.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <tuple>

namespace gpipe {
namespace skip {

SkipLayout::SkipLayout(size_t num_partitions, std::vector<SkipRoute> routes)
    : stashed_in_(num_partitions), popped_in_(num_partitions) {
  for (auto& route : routes) {
    TORCH_INTERNAL_ASSERT(route.stash_stage <= route.pop_stage &&
                          route.pop_stage < num_partitions);
    stashed_in_[route.stash_stage].push_back(route);
    popped_in_[route.pop_stage].push_back(route);
    const SkipKey key = route.key;
    routes_.emplace(key, std::move(route));
  }
  for (auto& popped : popped_in_) {
    std::sort(popped.begin(), popped.end(), [](const SkipRoute& a, const SkipRoute& b) {
      return std::tie(a.stash_stage, a.key) < std::tie(b.stash_stage, b.key);
    });
  }
}

std::vector<SkipRoute> SkipLayout::copy_policy(size_t pop_stage) const {
  std::vector<SkipRoute> policy;
  for (const auto& route : popped_in(pop_stage)) {
    if (route.stash_stage != pop_stage) policy.push_back(route);
  }
  return policy;
}

bool SkipLayout::requires_copy(const SkipKey& key) const {
  auto route = routes_.find(key);
  return route != routes_.end() && route->second.stash_stage != route->second.pop_stage;
}

const std::vector<SkipRoute>& SkipLayout::stashed_in(size_t partition) const {
  TORCH_CHECK_INDEX(partition < stashed_in_.size(), "partition ", partition,
                    " is out of range (partitions: ", stashed_in_.size(), ")");
  return stashed_in_[partition];
}

const std::vector<SkipRoute>& SkipLayout::popped_in(size_t partition) const {
  TORCH_CHECK_INDEX(partition < popped_in_.size(), "partition ", partition,
                    " is out of range (partitions: ", popped_in_.size(), ")");
  return popped_in_[partition];
}

SkipLayout inspect_skip_layout(const std::vector<torch::nn::Sequential>& partitions) {
  std::map<SkipKey, SkipRoute> open;  // stashed, not yet popped
  std::vector<SkipRoute> routes;
  for (const auto j : c10::irange(partitions.size())) {
    for (const auto& child : partitions[j]->named_children()) {
      const Skippable* layer = as_skippable(*child.value());
      if (layer == nullptr) continue;
      for (const auto& key : layer->stashable()) {
        open[key] = SkipRoute{key, j, j, child.key(), ""};
      }
      for (const auto& key : layer->poppable()) {
        auto stashed = open.find(key);
        if (stashed == open.end()) continue;
        SkipRoute route = std::move(stashed->second);
        open.erase(stashed);
        route.pop_stage = j;
        route.pop_layer = child.key();
        routes.push_back(std::move(route));
      }
    }
  }
  return SkipLayout(partitions.size(), std::move(routes));
}

}  // namespace skip
}  // namespace gpipe

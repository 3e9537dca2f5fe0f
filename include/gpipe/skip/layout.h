// SkipLayout: where each skip connection of a partitioned model starts and ends.
//
// A route (namespace, name) goes from the partition whose layer stashes it to the partition whose
// layer pops it. Routes within one partition need nothing special; routes between partitions are
// carried by portals, copied at the fence of the popping partition (copy_policy).
//
// Thread safety: immutable once built; may be read from any thread.
#pragma once

#include "gpipe/skip/namespace.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace gpipe {
namespace skip {

/// One skip connection: stashed in stage `stash_stage` by layer `stash_layer`, popped in stage
/// `pop_stage` by layer `pop_layer` (layer names as in the stage's Sequential). A stage is a
/// partition in GPipe (pipe.h), a stage in the schedule engines.
struct SkipRoute {
  SkipKey key;
  size_t stash_stage = 0;
  size_t pop_stage = 0;
  std::string stash_layer;
  std::string pop_layer;

  /// The stage at the other end from `stage`: the popping stage for the stashing one, the
  /// stashing stage for the popping one.
  int64_t other_stage(int64_t stage) const {
    return static_cast<int64_t>(stash_stage) == stage ? static_cast<int64_t>(pop_stage)
                                                      : static_cast<int64_t>(stash_stage);
  }
};

/// The skip routes of a model cut into partitions.
class SkipLayout {
 public:
  /// REQUIRES: every route's partitions are below num_partitions and stash <= pop.
  SkipLayout(size_t num_partitions, std::vector<SkipRoute> routes);

  size_t num_partitions() const { return stashed_in_.size(); }
  /// True when no layer stashes or pops anything.
  bool empty() const { return routes_.empty(); }

  /// The routes that partition `pop_stage` pops from other partitions, sorted by source
  /// partition, then namespace, then name: what its fence copies.
  std::vector<SkipRoute> copy_policy(size_t pop_stage) const;

  /// Whether `key`'s route crosses partitions (false for unknown keys).
  bool requires_copy(const SkipKey& key) const;

  /// The routes stashed, and popped, in `partition`.
  const std::vector<SkipRoute>& stashed_in(size_t partition) const;
  const std::vector<SkipRoute>& popped_in(size_t partition) const;

 private:
  std::map<SkipKey, SkipRoute> routes_;
  std::vector<std::vector<SkipRoute>> stashed_in_;
  std::vector<std::vector<SkipRoute>> popped_in_;  // sorted as copy_policy
};

/// The layout of the Skippable layers (top-level children) of `partitions`. A pop without an
/// earlier stash makes no route: verify_skippables() reports those.
SkipLayout inspect_skip_layout(const std::vector<torch::nn::Sequential>& partitions);

}  // namespace skip
}  // namespace gpipe

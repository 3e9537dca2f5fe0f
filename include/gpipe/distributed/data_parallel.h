// ReplicaGroup: the replicas of one pipeline stage under data parallelism (pipeline x data),
// which average their gradients after each step.
//
// With D replicas of a pipeline of P ranks (WORLD_SIZE = P x D), replica d runs on ranks
// d P, ..., d P + P - 1, so the replicas of pipeline rank p are ranks p, p + P, ..., p + (D - 1) P.
// Each replica trains on its own batch; averaging the gradients over the replicas then gives the
// gradients of the mean loss over all their batches (equal to one backward of their concatenation
// through the plain model when the batches are of equal size).
//
// Thread safety: all_reduce() is called by one thread (the rank's worker).
#pragma once

#include "gpipe/distributed/rendezvous.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gpipe {
namespace distributed {

/// The ranks that run the same stages in different replicas.
class ReplicaGroup {
 public:
  /// The replicas of this rank's pipeline rank, for pipelines of `pipeline_size` ranks; `name`
  /// keeps the group's keys apart in the store (the same on every rank). Throws c10::ValueError
  /// unless pipeline_size divides the world size.
  ReplicaGroup(const ProcessGroup& world, int64_t pipeline_size, const std::string& name,
               std::chrono::milliseconds timeout);

  /// The number of replicas.
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  const std::vector<int64_t>& ranks() const { return ranks_; }

  /// Sums `tensors` over the replicas, in place, and divides by size() if `average`: one
  /// all-reduce of all of them, flattened in double precision. Throws c10::Error naming the
  /// ranks if it fails. REQUIRES: every tensor defined; the same shapes on every replica.
  void all_reduce(std::vector<at::Tensor*> tensors, bool average);

 private:
  std::vector<int64_t> ranks_;
  std::string name_;
  c10::intrusive_ptr<Backend> group_;  // null for one replica
};

}  // namespace distributed
}  // namespace gpipe

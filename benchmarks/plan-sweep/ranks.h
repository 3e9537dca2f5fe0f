// What the ranks of a plan_sweep under a launcher (gpipe launch, torchrun) agree on: rank 0's
// plans, and each configuration's step times and peaks, so that every rank picks the same
// finalists and rank 0 reports them.
#pragma once

#include "gpipe/distributed/rendezvous.h"
#include "gpipe/plan.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gpipe {
namespace bench {

class Ranks {
 public:
  /// Joins the other ranks of the launcher's environment.
  Ranks();

  const distributed::ProcessGroup& group() const { return group_; }
  int64_t rank() const { return group_.rank(); }
  int64_t size() const { return group_.world_size(); }

  /// Rank 0's plans on every rank: rank 0 passes what plan_here() returns (or what it threw) to
  /// the others. Of each plan, the others receive only what training it needs (schedule, stages,
  /// micro-batches, checkpoint, balance).
  std::vector<Plan> share(const std::function<std::vector<Plan>()>& plan_here);

  /// Returns once every rank has called it.
  void barrier();

  /// Element by element, the largest of every rank's `values` (the same length on each).
  std::vector<double> max(std::vector<double> values);

  /// Every rank's `value`, by rank.
  std::vector<int64_t> gather(int64_t value);

 private:
  distributed::ProcessGroup group_;
};

}  // namespace bench
}  // namespace gpipe

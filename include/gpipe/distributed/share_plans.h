// Planning once for every rank: rank 0 profiles and searches (gpipe::plan, plan.h), and the
// other ranks train what it chose. Planning on every rank would profile the model once per rank,
// on cores the ranks share, and close plans could come out in a different order on each.
//
//   auto group = gpipe::distributed::rendezvous(gpipe::distributed::read_environment(), timeout);
//   const gpipe::Plan choice = gpipe::distributed::share_plans(group, [&] {
//     return std::vector<gpipe::Plan>{
//         gpipe::plan(model, sample, gpipe::PlanOptions(group.world_size()).ranks(true)).best()};
//   })[0];
//
// Thread safety: as the group's store (rendezvous.h).
#pragma once

#include "gpipe/distributed/rendezvous.h"
#include "gpipe/plan.h"

#include <functional>
#include <vector>

namespace gpipe {
namespace distributed {

/// Rank 0's plans on every rank of `ranks`: rank 0 runs `plan_here` and passes what it returns,
/// through the group's store, to the others, which receive of each plan what training it needs
/// (schedule, stages per worker, micro-batches, checkpoint mode, balance; the predictions stay
/// on rank 0). Every rank calls it, as often and in the same order. If `plan_here` throws on
/// rank 0, rank 0 rethrows it and each other rank throws c10::Error "rank 0 could not plan:
/// <rank 0's message>", rather than wait for plans until the store's timeout.
std::vector<Plan> share_plans(const ProcessGroup& ranks,
                              const std::function<std::vector<Plan>()>& plan_here);

}  // namespace distributed
}  // namespace gpipe

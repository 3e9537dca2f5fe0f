// Clock alignment: where the ranks' timeline starts on each rank's own steady clock, so that
// their traces share one time axis (trace.h: Tracer::join_timeline).
//
// Rank 0's clock is the timeline's; its time 0 is when rank 0 began aligning. Every other rank
// measures its offset to rank 0 through the store, as NTP does over a network: it notes its
// clock (t1), asks, rank 0 answers with its own clock's reading, and it notes its clock again
// (t2). Rank 0 read its clock somewhere between t1 and t2, so taking the middle is off by at
// most half the round trip; of up to 8 tries (fewer where the store is slow) the shortest round
// trip is kept, and half of it is the uncertainty. Ranks on one machine share one steady clock and come out within that bound
// of each other; across machines the bound holds at the moment of aligning, and the machines'
// clocks drift apart by their rate difference after.
//
// The ranks align before they declare themselves connected, so no rank is still aligning when
// another starts stepping; every store call is bounded (bounded_store.h), so a lost or frozen
// store is rank 0's failure, named, not a hang.
//
// Internal to PipelineStage (pipeline_stage.cpp).
#pragma once

#include "distributed/bounded_store.h"
#include "gpipe/distributed/environment.h"

#include <chrono>
#include <cstdint>
#include <string>

namespace gpipe {
namespace distributed {

/// The timeline's time 0 on this rank's steady clock, known to within `uncertainty_us`.
struct TimelineOrigin {
  std::chrono::steady_clock::time_point origin;
  double uncertainty_us = 0;
};

/// Every rank of `environment` calls it at once, with the same `name` (its keys in `store`, used
/// once). Waits at most `timeout` for each answer. Throws c10::Error naming rank 0 (or
/// torchrun's agent) where the store is lost or frozen, and the rank that did not answer in
/// time.
TimelineOrigin align_clocks(BoundedStore& store, const Environment& environment,
                            const std::string& name, std::chrono::milliseconds timeout);

}  // namespace distributed
}  // namespace gpipe

// Predicts a schedule's step from what its actions cost: when each action of each worker starts
// and ends, the step time, each worker's idle share (the bubble) and the micro-batches each stage
// holds at once - to choose a schedule before running it, or to see what a run lost.
//
// The model: each worker runs its actions in order, one at a time. A compute action takes its
// stage's cost of that kind. A send takes no time of its worker; its message arrives `latency`
// plus its bytes times `seconds_per_byte` later, or at once between two stages of one worker. A
// receive waits until its message has arrived. With a receive window of w (the receives posted
// ahead per edge, distributed/c10d_transport.h), message k of an edge leaves only once its receive
// is posted, when the receive of message k - w has ended, and the sender hears of it `latency`
// later. Workers share nothing but the cores: with `cores` set and more workers computing at
// once than that, each computes at cores / computing of its speed (the operating system's fair
// share, as worker threads sharing a CPU run); with 0, every worker has its own.
//
// Costs come from a trace of real steps (costs_from_trace) or are given, e.g. ActionCosts::unit
// for the unit-time pictures of the papers: there the bubble of GPipe and 1F1B is
// (P - 1) / (M + P - 1) for P stages and M micro-batches.
//
// Thread safety: pure functions.
#pragma once

#include "gpipe/schedule/action.h"
#include "gpipe/schedule/validate.h"
#include "gpipe/trace.h"

#include <cstdint>
#include <vector>

namespace gpipe {
namespace schedule {

/// What each action costs, in seconds (or any one unit).
struct ActionCosts {
  /// Per stage: a forward, a whole backward, and its input and weight halves (zero-bubble
  /// schedules).
  std::vector<double> forward, backward, backward_input, backward_weight;
  /// From a send to its receive, between two workers: latency + bytes * seconds_per_byte.
  double latency = 0;
  double seconds_per_byte = 0;
  /// Per stage: the bytes of the activation it sends per micro-batch; its gradient comes back
  /// as large. Empty for none.
  std::vector<int64_t> message_bytes;
  /// Receives posted ahead per edge between two workers: the step's first `receive_window`
  /// messages of an edge find theirs posted; each later one waits for the receive of the one
  /// `receive_window` before it to end. 0 for every receive posted as the step starts.
  int64_t receive_window = 0;
  /// Workers that compute at full speed at once: with more computing, each runs at
  /// cores / computing of its speed. 0 for one each.
  int64_t cores = 0;

  /// Every stage's forward 1, backward 2, each half 1; messages free.
  static ActionCosts unit(int64_t num_stages);
};

/// A predicted step.
struct Prediction {
  /// begin[w][k] and end[w][k]: when actions[w][k] starts and ends, from the step's start.
  std::vector<std::vector<double>> begin, end;
  /// When the last action ends.
  double step_time = 0;
  /// Per worker: the time it computes.
  std::vector<double> busy;
  /// The share of worker time not computing: 1 - sum(busy) / (workers * step_time), or of the
  /// cores' time where the workers share fewer cores.
  double bubble_fraction = 0;
  /// Per stage: the most micro-batches forwarded and not yet through their weight gradient,
  /// whose graphs it holds (Stage::peak_live_microbatches on a real step).
  std::vector<int64_t> peak_live_microbatches;
  /// Per stage: the most of them past their input gradient and waiting for their weight
  /// gradient at once (0 where backwards are not split).
  std::vector<int64_t> peak_awaiting_weight_microbatches;
  /// Per worker: what its stages held at the moments its memory can peak
  /// (Timeline::held_microbatches).
  std::vector<std::vector<std::vector<HeldMicrobatches>>> held_microbatches;
};

/// How many workers of `threads` intra-op threads each this machine's CPU runs at full speed at
/// once, as ActionCosts::cores takes it: its cores over `threads`, at least 1.
int64_t cpu_workers_at_once(int64_t threads);

/// Predicts `schedule` under `costs`. Throws c10::ValueError for an invalid schedule
/// (validate.h), or for costs with fewer entries than stages, negative, or a negative window or
/// count of cores.
Prediction predict(const Schedule& schedule, const ActionCosts& costs);

/// As above, with the schedule's simulation made once (`timeline`: simulate(schedule), which
/// validated it) for many costs: simulating takes most of a prediction's time, and a planner
/// predicts one schedule under many balances. Throws c10::ValueError, besides the above, for a
/// timeline of another shape than the schedule.
Prediction predict(const Schedule& schedule, const ActionCosts& costs, const Timeline& timeline);

/// The median duration of each compute kind per stage among `events` (a tracer's, trace.h), in
/// seconds, for `num_stages` stages. A kind the trace lacks is made of the others: a whole
/// backward is its halves' sum, each half half a backward. Messages are left free. With `cores`
/// (> 0), the events ran on that many cores shared: each counts the time it would have taken
/// alone, its duration at cores / computing of full speed wherever more of the trace's compute
/// events ran at once, and the costs carry `cores` for predict(). Throws c10::ValueError if some
/// stage has no forward or no backward of either kind, or for negative cores.
ActionCosts costs_from_trace(const std::vector<trace::Event>& events, int64_t num_stages,
                             int64_t cores = 0);

}  // namespace schedule
}  // namespace gpipe

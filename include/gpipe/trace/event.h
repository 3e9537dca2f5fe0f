// Trace events: one task of a pipeline's timeline, and what a timeline tells: its workers'
// utilization and bubble. Tracer (trace.h) records them; the writers (chrome_trace.h,
// svg_timeline.h) draw them.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpipe {
namespace trace {

/// One task: `name` ("forward", "backward", "recompute", "send", "recv", ...) of `microbatch`
/// on `stage`, run by `worker` during training step `step`, from `begin_us` to `end_us` on its
/// tracer's clock. `rank` is the process that ran it: 0 unless its tracer joined the timeline
/// of several ranks.
struct Event {
  std::string name;
  int64_t worker = 0;
  int64_t stage = 0;
  int64_t microbatch = 0;
  int64_t step = 0;
  double begin_us = 0;
  double end_us = 0;
  int64_t rank = 0;
};

/// True for the events that compute: "forward" and the "backward..." kinds (a "recompute" runs
/// inside a backward and is not counted twice).
bool is_compute(const Event& event);

/// Worker time during steps: `available` is the number of workers (of every rank) times the span
/// of each step (first begin to last end), `busy` the compute time; both summed over steps, in
/// microseconds. Utilizations of separate steps add up.
struct Utilization {
  double busy_us = 0;
  double available_us = 0;

  Utilization& operator+=(const Utilization& other);
  /// 1 - busy / available; 0 when nothing was available.
  double bubble_fraction() const;
};

Utilization utilization(const std::vector<Event>& events);

/// The share of worker time spent idle during steps: utilization(events).bubble_fraction().
double bubble_fraction(const std::vector<Event>& events);

/// Whether the events come from the ranks of a multi-process pipeline, as far as they tell: some
/// come from another rank than 0. Their files and pictures then name the ranks.
bool from_ranks(const std::vector<Event>& events);

}  // namespace trace
}  // namespace gpipe

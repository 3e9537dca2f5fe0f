// Tracing: a timeline of pipeline tasks - which worker ran which stage's forward, backward,
// recompute, send or receive of which micro-batch, and when - kept in memory and written as a
// Chrome/Perfetto trace (JSON) or as an SVG picture.
//
// A Tracer collects events. A thread that works for a pipeline installs one with UseTracer
// (naming its worker row and the training step); every TraceSpan on that thread then records
// the time from its construction to its destruction. Without a tracer on the thread, and with no
// profiler listening, a TraceSpan costs a few thread-local accesses.
//
// Every TraceSpan is also a LibTorch RecordFunction, "gpipe::<name>(stage=S, microbatch=I)",
// so that a profiler the user runs (torch.profiler / Kineto, autograd's legacy profiler, or a
// RecordFunction callback) sees each pipeline task, with or without a Tracer.
//
// Ranks: the tracer of each rank of a multi-process pipeline joins one timeline
// (distributed::PipelineStage does it): its events carry its rank, and its clock reads what rank
// 0's reads at the same moment, to within the alignment's uncertainty. Each rank's trace file
// then merges with the others' (`gpipe trace merge`) into one timeline, a process per rank.
//
// The events and what they tell (utilization, bubble) are in trace/event.h, the writers in
// trace/chrome_trace.h and trace/svg_timeline.h; this header includes them.
//
// Thread safety: Tracer::record and Tracer::events may be called from any thread (a mutex guards
// the events). UseTracer and TraceSpan act on the calling thread only.
#pragma once

#include "gpipe/trace/chrome_trace.h"
#include "gpipe/trace/event.h"
#include "gpipe/trace/svg_timeline.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

namespace at {
struct RecordFunction;
}  // namespace at

namespace gpipe {
namespace trace {

/// Collects events.
class Tracer {
 public:
  Tracer();

  /// Microseconds since this tracer's origin: when it was made, or the one it joined.
  double now_us() const;

  /// The origin, time 0 of its events, on this process's steady clock.
  std::chrono::steady_clock::time_point origin() const;

  /// Joins the timeline of a multi-process pipeline as `rank`: from now on the clock counts from
  /// `origin` (the timeline's time 0 on this process's steady clock, known to within
  /// `uncertainty_us`) and every event carries `rank`. Events recorded before move with the
  /// clock and take the rank too, so they stay comparable. Call it while no span is open.
  void join_timeline(int64_t rank, std::chrono::steady_clock::time_point origin,
                     double uncertainty_us);

  /// The rank given to join_timeline (0 before).
  int64_t rank() const;

  /// How far this clock may be from the timeline's, in microseconds (0 before joining one).
  double clock_uncertainty_us() const;

  /// Records `event` with this tracer's rank.
  void record(Event event);

  /// Every event recorded so far, in the order recorded.
  std::vector<Event> events() const;

  void clear();

 private:
  // The origin on the steady clock, in its ticks: read by every span, without the mutex.
  std::atomic<std::chrono::steady_clock::rep> origin_;
  int64_t rank_ = 0;           // guarded by mutex_
  double uncertainty_us_ = 0;  // guarded by mutex_
  mutable std::mutex mutex_;
  std::vector<Event> events_;  // guarded by mutex_
};

/// Makes `tracer` (may be null: no tracing) the calling thread's tracer, recording as `worker`
/// in `step`, until destroyed; then restores the previous one.
class UseTracer {
 public:
  UseTracer(Tracer* tracer, int64_t worker, int64_t step);
  ~UseTracer();
  UseTracer(const UseTracer&) = delete;
  UseTracer& operator=(const UseTracer&) = delete;

 private:
  Tracer* previous_tracer_;
  int64_t previous_worker_;
  int64_t previous_step_;
};

/// Records one event of the calling thread's tracer, if it has one, from now until destroyed.
/// `name` must outlive the span (a string literal). A negative stage or micro-batch means that
/// of the enclosing span on this thread (e.g. a recompute inside the backward of a stage).
class TraceSpan {
 public:
  TraceSpan(const char* name, int64_t stage = -1, int64_t microbatch = -1);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer* tracer_;
  const char* name_;
  int64_t stage_;
  int64_t microbatch_;
  int64_t enclosing_stage_;
  int64_t enclosing_microbatch_;
  double begin_us_ = 0;
  std::unique_ptr<at::RecordFunction> profiled_;  // while a profiler listens
};

}  // namespace trace
}  // namespace gpipe

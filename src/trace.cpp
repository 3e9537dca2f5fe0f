#include "gpipe/trace.h"

#include <ATen/record_function.h>

#include <string>
#include <utility>

namespace gpipe {
namespace trace {
namespace {

thread_local Tracer* t_tracer = nullptr;
thread_local int64_t t_worker = 0;
thread_local int64_t t_step = 0;
thread_local int64_t t_stage = 0;       // of the innermost span
thread_local int64_t t_microbatch = 0;  // of the innermost span

}  // namespace

Tracer::Tracer() : origin_(std::chrono::steady_clock::now().time_since_epoch().count()) {}

std::chrono::steady_clock::time_point Tracer::origin() const {
  return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(origin_.load()));
}

double Tracer::now_us() const {
  const std::chrono::steady_clock::duration since_origin(
      std::chrono::steady_clock::now().time_since_epoch().count() - origin_.load());
  return std::chrono::duration<double, std::micro>(since_origin).count();
}

void Tracer::join_timeline(int64_t rank, std::chrono::steady_clock::time_point origin,
                           double uncertainty_us) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::chrono::steady_clock::duration moved(origin_.load() -
                                                  origin.time_since_epoch().count());
  const double moved_us = std::chrono::duration<double, std::micro>(moved).count();
  for (auto& e : events_) {
    e.begin_us += moved_us;
    e.end_us += moved_us;
    e.rank = rank;
  }
  origin_ = origin.time_since_epoch().count();
  rank_ = rank;
  uncertainty_us_ = uncertainty_us;
}

int64_t Tracer::rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rank_;
}

double Tracer::clock_uncertainty_us() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return uncertainty_us_;
}

void Tracer::record(Event event) {
  std::lock_guard<std::mutex> lock(mutex_);
  event.rank = rank_;
  events_.push_back(std::move(event));
}

std::vector<Event> Tracer::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

void Tracer::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.clear();
}

UseTracer::UseTracer(Tracer* tracer, int64_t worker, int64_t step)
    : previous_tracer_(t_tracer), previous_worker_(t_worker), previous_step_(t_step) {
  t_tracer = tracer;
  t_worker = worker;
  t_step = step;
}

UseTracer::~UseTracer() {
  t_tracer = previous_tracer_;
  t_worker = previous_worker_;
  t_step = previous_step_;
}

TraceSpan::TraceSpan(const char* name, int64_t stage, int64_t microbatch)
    : tracer_(t_tracer),
      name_(name),
      stage_(stage >= 0 ? stage : t_stage),
      microbatch_(microbatch >= 0 ? microbatch : t_microbatch),
      enclosing_stage_(t_stage),
      enclosing_microbatch_(t_microbatch) {
  t_stage = stage_;
  t_microbatch = microbatch_;
  if (at::hasCallbacks()) {
    auto profiled = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (profiled->isActive()) {
      profiled->before("gpipe::" + std::string(name) + "(stage=" + std::to_string(stage_) +
                       ", microbatch=" + std::to_string(microbatch_) + ")");
      profiled_ = std::move(profiled);
    }
  }
  if (tracer_ != nullptr) begin_us_ = tracer_->now_us();
}

TraceSpan::~TraceSpan() {
  if (tracer_ != nullptr) {
    tracer_->record({name_, t_worker, stage_, microbatch_, t_step, begin_us_, tracer_->now_us()});
  }
  t_stage = enclosing_stage_;
  t_microbatch = enclosing_microbatch_;
}

}  // namespace trace
}  // namespace gpipe

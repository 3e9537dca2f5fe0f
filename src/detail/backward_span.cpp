#include "detail/backward_span.h"

#include <utility>

namespace gpipe {
namespace detail {

BackwardSpan::BackwardSpan(std::shared_ptr<trace::Tracer> tracer, int64_t partition,
                           int64_t microbatch, int64_t step)
    : tracer_(std::move(tracer)), partition_(partition), microbatch_(microbatch), step_(step) {}

void BackwardSpan::watch_input(const Batch& input) {
  for (const auto& x : input) {
    if (!x.defined() || !x.requires_grad()) continue;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++inputs_left_;
    }
    // The hook holds the span; the span holds no tensor.
    x.register_hook([span = shared_from_this()](const at::Tensor&) { span->input_done(); });
  }
}

void BackwardSpan::watch_output(const Batch& output) {
  for (const auto& y : output) {
    if (!y.defined() || !y.requires_grad()) continue;
    y.register_hook([span = shared_from_this()](const at::Tensor&) { span->begin(); });
  }
}

void BackwardSpan::begin() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (begin_us_ < 0) begin_us_ = tracer_->now_us();
}

void BackwardSpan::input_done() {
  double begin_us;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--inputs_left_ != 0 || begin_us_ < 0) return;
    begin_us = begin_us_;
  }
  tracer_->record(
      {"backward", partition_, partition_, microbatch_, step_, begin_us, tracer_->now_us()});
}

}  // namespace detail
}  // namespace gpipe

// BackwardSpan: the backward of one partition's micro-batch in GPipe, as a trace event.
//
// GPipe's backward runs inside autograd, not as a task of its own: it begins when the gradient of
// the partition's output arrives and ends when the gradient of its input has been computed.
// Hooks on those tensors record it in the tracer, as "backward" on the partition's row, with the
// recomputation (if checkpointed) inside it. Where the input takes no gradient there is no end
// to see and nothing is recorded: only on the first partition, for micro-batch 0 when the user's
// input needs no gradient (later micro-batches' inputs carry the backward-order edge).
//
// Internal to the pipeline (pipeline.h).
#pragma once

#include "gpipe/microbatch.h"
#include "gpipe/trace.h"

#include <cstdint>
#include <memory>
#include <mutex>

namespace gpipe {
namespace detail {

class BackwardSpan : public std::enable_shared_from_this<BackwardSpan> {
 public:
  BackwardSpan(std::shared_ptr<trace::Tracer> tracer, int64_t partition, int64_t microbatch,
               int64_t step);

  /// Watches the tensors the partition computes from: the last of their gradients ends it.
  void watch_input(const Batch& input);
  /// Watches the tensors it produced: the first of their gradients begins it.
  void watch_output(const Batch& output);

 private:
  void begin();
  void input_done();

  std::shared_ptr<trace::Tracer> tracer_;
  int64_t partition_;
  int64_t microbatch_;
  int64_t step_;
  std::mutex mutex_;
  double begin_us_ = -1;     // guarded by mutex_; -1 until begun
  int64_t inputs_left_ = 0;  // guarded by mutex_
};

}  // namespace detail
}  // namespace gpipe

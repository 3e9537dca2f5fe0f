// ThreadTransport: the in-process Transport, for stages run by threads of one process.
//
// One bounded queue per directed edge between neighbouring stages (s -> s + 1 for activations,
// s + 1 -> s for gradients), and an unbounded one per edge of the skip lane, between any two
// stages. Tensors pass by reference, with no copy: the sender hands over tensors that it no
// longer changes.
//
// Thread safety: every call may come from any thread. All queues are guarded by one mutex;
// waiting calls sleep on one condition variable.
#pragma once

#include "gpipe/schedule/transport.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {

/// Queues between threads.
class ThreadTransport : public Transport {
 public:
  /// Queues for the edges of `num_stages` stages, each holding at most `capacity` messages.
  /// Throws c10::ValueError unless both are positive.
  ThreadTransport(int64_t num_stages, int64_t capacity);

  /// Throws c10::IndexError unless the stages are in range and, on the pipeline lane,
  /// neighbours.
  void send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag,
            Lane lane = Lane::kPipeline) override;
  Batch recv(int64_t from_stage, int64_t to_stage, int64_t tag,
             Lane lane = Lane::kPipeline) override;
  void abort() override;

 private:
  using Queue = std::deque<std::pair<int64_t, Batch>>;
  Queue& queue(int64_t from_stage, int64_t to_stage, Lane lane);

  const int64_t num_stages_;
  const size_t capacity_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool aborted_ = false;  // guarded by mutex_
  // Guarded by mutex_: queues_[2 * s] carries s -> s + 1, queues_[2 * s + 1] s + 1 -> s.
  std::vector<Queue> queues_;
  std::map<std::pair<int64_t, int64_t>, Queue> skip_queues_;  // guarded by mutex_, by edge
};

}  // namespace schedule
}  // namespace gpipe

#include "gpipe/schedule/thread_transport.h"

#include <c10/util/Exception.h>

namespace gpipe {
namespace schedule {

ThreadTransport::ThreadTransport(int64_t num_stages, int64_t capacity)
    : num_stages_(num_stages), capacity_(static_cast<size_t>(capacity)) {
  TORCH_CHECK_VALUE(num_stages > 0, "num_stages must be positive, but got ", num_stages);
  TORCH_CHECK_VALUE(capacity > 0, "queue capacity must be positive, but got ", capacity);
  queues_.resize(2 * num_stages);
}

ThreadTransport::Queue& ThreadTransport::queue(int64_t from_stage, int64_t to_stage, Lane lane) {
  const bool neighbours = to_stage == from_stage + 1 || to_stage + 1 == from_stage;
  TORCH_CHECK_INDEX(
      from_stage >= 0 && from_stage < num_stages_ && to_stage >= 0 && to_stage < num_stages_ &&
          from_stage != to_stage && (neighbours || lane == Lane::kSkip),
      "no edge from stage ", from_stage, " to stage ", to_stage, " among ", num_stages_, " stages");
  if (lane == Lane::kSkip) return skip_queues_[{from_stage, to_stage}];
  return to_stage > from_stage ? queues_[2 * from_stage] : queues_[2 * to_stage + 1];
}

void ThreadTransport::send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag,
                           Lane lane) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& q = queue(from_stage, to_stage, lane);
  changed_.wait(lock, [&] { return aborted_ || lane == Lane::kSkip || q.size() < capacity_; });
  TORCH_CHECK(!aborted_, "transport aborted while stage ", from_stage, " sent message ", tag,
              " to stage ", to_stage, ": another stage failed");
  q.emplace_back(tag, std::move(batch));
  changed_.notify_all();
}

Batch ThreadTransport::recv(int64_t from_stage, int64_t to_stage, int64_t tag, Lane lane) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& q = queue(from_stage, to_stage, lane);
  changed_.wait(lock, [&] { return aborted_ || !q.empty(); });
  TORCH_CHECK(!aborted_, "transport aborted while stage ", to_stage, " waited for message ", tag,
              " from stage ", from_stage, ": another stage failed");
  TORCH_CHECK_VALUE(q.front().first == tag, "stage ", to_stage, " expected message ", tag,
                    " from stage ", from_stage, ", but the next one is ", q.front().first);
  Batch batch = std::move(q.front().second);
  q.pop_front();
  changed_.notify_all();
  return batch;
}

void ThreadTransport::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  changed_.notify_all();
}

}  // namespace schedule
}  // namespace gpipe

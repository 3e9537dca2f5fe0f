#include "schedule/greedy_split_backward.h"

#include "gpipe/schedule/generators.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <optional>
#include <vector>

namespace gpipe {
namespace schedule {
namespace detail {

Schedule greedy_split_backward(int64_t num_workers, int64_t stages_per_worker,
                               int64_t num_microbatches, Placement placement,
                               const std::function<int64_t(int64_t)>& limit) {
  const int64_t W = num_workers;
  const int64_t v = stages_per_worker;
  const int64_t M = num_microbatches;
  const int64_t S = W * v;
  std::vector<std::vector<int64_t>> stages_of(W);  // each worker's, the one nearest the loss first
  for (int64_t s = S - 1; s >= 0; --s) stages_of[worker_of(placement, s, W)].push_back(s);
  constexpr int64_t kNotYet = -1;
  std::vector<int64_t> forward_tick(S * M, kNotYet), input_grad_tick(S * M, kNotYet);
  const auto cell = [M](int64_t stage, int64_t i) { return stage * M + i; };
  const auto done_before = [](int64_t tick, int64_t now) { return tick != kNotYet && tick < now; };
  std::vector<int64_t> forwards(S, 0), backwards(S, 0), weights(S, 0);  // per stage: how many
  std::vector<int64_t> held(W, 0), left(W, v * M);                      // per worker
  std::vector<std::vector<Action>> computes(W);
  for (int64_t tick = 0, finished = 0; finished < W; ++tick) {
    bool progressed = false;
    for (int pass = 0; pass < 2 && !progressed; ++pass) {
      // The second pass, only when nothing could run, lifts the memory bound.
      const bool bounded = pass == 0;
      for (const auto w : c10::irange(W)) {
        if (left[w] == 0) continue;
        std::optional<Action> next;
        for (const int64_t s : stages_of[w]) {
          const int64_t i = backwards[s];
          if (i == M || (next && next->microbatch <= i)) continue;
          if (done_before(forward_tick[cell(s, i)], tick) &&
              (s == S - 1 || done_before(input_grad_tick[cell(s + 1, i)], tick))) {
            next = Action{ActionKind::kBackwardInput, i, s};
          }
        }
        if (!next && (!bounded || held[w] < limit(w))) {
          for (const int64_t s : stages_of[w]) {
            const int64_t i = forwards[s];
            if (!next && i < M && (s == 0 || done_before(forward_tick[cell(s - 1, i)], tick))) {
              next = Action{ActionKind::kForward, i, s};
            }
          }
        }
        if (!next) {
          for (const int64_t s : stages_of[w]) {
            const int64_t i = weights[s];
            if (i < backwards[s] && (!next || i < next->microbatch)) {
              next = Action{ActionKind::kBackwardWeight, i, s};
            }
          }
        }
        if (!next) continue;
        const int64_t s = next->stage;
        if (next->kind == ActionKind::kForward) {
          forward_tick[cell(s, forwards[s]++)] = tick;
          ++held[w];
        } else if (next->kind == ActionKind::kBackwardInput) {
          input_grad_tick[cell(s, backwards[s]++)] = tick;
        } else {
          ++weights[s];
          --held[w];
          if (--left[w] == 0) ++finished;
        }
        computes[w].push_back(*next);
        progressed = true;
      }
    }
    TORCH_INTERNAL_ASSERT(progressed, "zero-bubble generator stalled at tick ", tick);
  }
  return with_communication(Schedule{W, S, M, placement, computes});
}

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

#include "gpipe/schedule/generators.h"

#include "schedule/faster_order.h"
#include "schedule/generator_checks.h"
#include "schedule/greedy_split_backward.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <deque>
#include <map>
#include <vector>

namespace gpipe {
namespace schedule {

namespace {

// ZB-V phase by phase, as the paper (Qi et al., 2024) and torch.distributed.pipelining write it,
// for worker w of W: forwards down the V until the first micro-batch comes back, then for each
// micro-batch F, B, W of the stage going down and of the one coming back, so that a message
// always has an action's time to arrive; micro-batches are counted as if there were at least
// 2W - 1, and those past M left out.
Schedule zbv_phases(int64_t W, int64_t M) {
  const int64_t counted = std::max(2 * W - 1, M);
  std::vector<std::vector<Action>> computes(W);
  for (const auto w : c10::irange(W)) {
    const int64_t down = w, up = 2 * W - 1 - w;
    int64_t forwards_down = 0, forwards_up = 0, backwards_down = 0, backwards_up = 0;
    std::vector<Action> actions;
    const auto forward = [&](int64_t stage, int64_t& count) {
      actions.push_back({ActionKind::kForward, count++, stage});
    };
    const auto input = [&](int64_t stage, int64_t i) {
      actions.push_back({ActionKind::kBackwardInput, i, stage});
    };
    const auto weight = [&](int64_t stage, int64_t i) {
      actions.push_back({ActionKind::kBackwardWeight, i, stage});
    };
    for (int64_t k = 0; k < 2 * (W - w) - 1; ++k) forward(down, forwards_down);
    for (int64_t k = 0; k < w; ++k) {
      forward(up, forwards_up);
      forward(down, forwards_down);
    }
    for (int64_t k = 0; k < W - w; ++k) {
      forward(up, forwards_up);
      input(up, backwards_up);
      weight(up, backwards_up++);
    }
    while (forwards_up < forwards_down || forwards_down < counted) {
      if (forwards_down < counted) forward(down, forwards_down);
      input(down, backwards_down);
      weight(down, backwards_down++);
      forward(up, forwards_up);
      input(up, backwards_up);
      weight(up, backwards_up++);
    }
    int64_t weights_down = backwards_down, weights_up = backwards_up;
    for (int64_t k = 0; k < w; ++k) {
      input(down, backwards_down++);
      input(up, backwards_up++);
    }
    for (int64_t k = 0; k < W - w; ++k) {
      input(down, backwards_down++);
      weight(down, weights_down++);
    }
    while (weights_up < backwards_up) weight(up, weights_up++);
    while (weights_down < backwards_down) weight(down, weights_down++);
    for (const Action& a : actions) {
      if (a.microbatch < M) computes[w].push_back(a);
    }
  }
  return with_communication(Schedule{W, 2 * W, M, Placement::kV, computes});
}

}  // namespace

Schedule zbv_schedule(int64_t num_workers, int64_t num_microbatches) {
  detail::check_v_size(num_workers, num_microbatches);
  // Simulated, a worker holding at most 2W half-size micro-batches (the memory of 1F1B's first
  // stage), it packs the fewest micro-batches tightest; the phases hide messages (and hold as
  // many).
  return detail::faster_order(
      detail::greedy_split_backward(num_workers, 2, num_microbatches, Placement::kV,
                                    [num_workers](int64_t) { return 2 * num_workers; }),
      zbv_phases(num_workers, num_microbatches));
}

namespace {

// One worker's compute list as DualPipeV writes it: each stage's forwards and backwards take the
// next micro-batch in order, and the weight gradients wait in a queue, oldest first.
class DualPipeVList {
 public:
  explicit DualPipeVList(std::vector<Action>& actions) : actions_(actions) {}

  void forward(int64_t stage) {
    actions_.push_back({ActionKind::kForward, forwards_[stage]++, stage});
  }
  // The whole backward, or (split) its input half with the weight half queued.
  void backward(int64_t stage, bool split = false) {
    const int64_t i = backwards_[stage]++;
    if (!split) {
      actions_.push_back({ActionKind::kBackward, i, stage});
      return;
    }
    actions_.push_back({ActionKind::kBackwardInput, i, stage});
    weights_.push_back({ActionKind::kBackwardWeight, i, stage});
  }
  void weight_if_pending() {
    if (weights_.empty()) return;
    actions_.push_back(weights_.front());
    weights_.pop_front();
  }

 private:
  std::vector<Action>& actions_;
  std::map<int64_t, int64_t> forwards_, backwards_;
  std::deque<Action> weights_;
};

}  // namespace

Schedule dualpipev_schedule(int64_t num_workers, int64_t num_microbatches) {
  detail::check_v_size(num_workers, num_microbatches);
  const int64_t W = num_workers;
  const int64_t M = num_microbatches;
  TORCH_CHECK_VALUE(M >= min_microbatches(ScheduleKind::kDualPipeV, 2 * W),
                    "schedule dualpipev needs at least as many micro-batches as stages (", 2 * W,
                    " for ", W, " workers), but got ", M);
  std::vector<std::vector<Action>> computes(W);
  for (const auto w : c10::irange(W)) {
    // DeepSeek's DualPipeV, phase by phase as torch.distributed.pipelining writes it; an
    // overlapped pair "F a, B b" runs back to back. `down` is the V's stage on the way down,
    // `up` the one on the way back.
    const int64_t down = w;
    const int64_t up = 2 * W - 1 - w;
    DualPipeVList list(computes[w]);
    for (int64_t k = 0; k < 2 * (W - w - 1); ++k) list.forward(down);
    for (int64_t k = 0; k <= w; ++k) {
      list.forward(down);
      list.forward(up);
    }
    for (int64_t k = 0; k < W - w - 1; ++k) {
      list.backward(up, /*split=*/true);
      list.weight_if_pending();
      list.forward(up);
    }
    for (int64_t k = 0; k < M - 2 * W + w + 1;
         ++k) {  // the steady state: F down + B up, F up + B down
      list.forward(down);
      list.backward(up);
      list.forward(up);
      list.backward(down);
    }
    for (int64_t k = 0; k < W - w - 1; ++k) {
      list.backward(up);
      list.forward(up);
      list.backward(down);
    }
    // The cooldown: from the middle on, backwards split to let the weight halves fill the gaps.
    bool split = false;
    for (int64_t k = 0; k <= w; ++k) {
      if (k == (w + 1) / 2 && w % 2 == 1) split = true;
      list.backward(up, split);
      if (k == (w + 1) / 2 && w % 2 == 0) split = true;
      list.backward(down, split);
    }
    for (int64_t k = 0; k < W - w - 1; ++k) {
      list.weight_if_pending();
      list.backward(down, split);
    }
    for (int64_t k = 0; k <= w; ++k) list.weight_if_pending();
  }
  return with_communication(Schedule{W, 2 * W, M, Placement::kV, computes});
}

}  // namespace schedule
}  // namespace gpipe

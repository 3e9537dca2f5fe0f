#include "gpipe/schedule/generators.h"

#include "schedule/faster_order.h"
#include "schedule/generator_checks.h"
#include "schedule/greedy_split_backward.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {

Schedule with_communication(const Schedule& computes) {
  Schedule schedule = computes;
  const int64_t last_stage = computes.num_stages - 1;
  for (const auto w : c10::irange(computes.actions.size())) {
    auto& actions = schedule.actions[w];
    actions.clear();
    for (const Action& a : computes.actions[w]) {
      TORCH_CHECK_VALUE(is_compute(a.kind),
                        "with_communication takes compute actions only, but worker ", w, " has ",
                        a);
      const bool first = a.stage == 0;
      const bool last = a.stage == last_stage;
      if (a.kind == ActionKind::kForward) {
        if (!first) actions.push_back({ActionKind::kRecvActivation, a.microbatch, a.stage});
        actions.push_back(a);
        if (!last) actions.push_back({ActionKind::kSendActivation, a.microbatch, a.stage});
      } else if (a.kind == ActionKind::kBackwardWeight) {
        actions.push_back(a);  // local: nothing to receive or send
      } else {
        if (!last) actions.push_back({ActionKind::kRecvGradient, a.microbatch, a.stage});
        actions.push_back(a);
        if (!first) actions.push_back({ActionKind::kSendGradient, a.microbatch, a.stage});
      }
    }
  }
  return schedule;
}

namespace {

// How many forwards worker w of W, with v looped stages each, keeps ahead of its backwards in
// interleaved 1F1B: Megatron-LM's warm-up, plus one.
int64_t interleaved_warmup(int64_t W, int64_t v, int64_t w) {
  return (W - w - 1) * 2 + (v - 1) * W + 1;
}

// The schedule of one stage per worker in which stage s computes what `order(s, list)` appends
// to its (empty) list, with the sends and receives that connect them.
template <typename Order>
Schedule one_stage_per_worker(int64_t num_stages, int64_t num_microbatches, Order order) {
  detail::check_size(num_stages, num_microbatches);
  std::vector<std::vector<Action>> computes(num_stages);
  for (const auto s : c10::irange(num_stages)) order(s, computes[s]);
  return with_communication(
      Schedule{num_stages, num_stages, num_microbatches, Placement::kLooped, computes});
}

}  // namespace

Schedule gpipe_schedule(int64_t num_stages, int64_t num_microbatches) {
  return one_stage_per_worker(num_stages, num_microbatches, [&](int64_t s, auto& list) {
    for (const auto i : c10::irange(num_microbatches)) list.push_back({ActionKind::kForward, i, s});
    for (const auto i : c10::irange(num_microbatches)) {
      list.push_back({ActionKind::kBackward, i, s});
    }
  });
}

Schedule one_f_one_b_schedule(int64_t num_stages, int64_t num_microbatches) {
  return one_stage_per_worker(num_stages, num_microbatches, [&](int64_t s, auto& list) {
    const int64_t warmup = std::min(num_stages - 1 - s, num_microbatches);
    int64_t forward = 0;
    int64_t backward = 0;
    for (; forward < warmup; ++forward) list.push_back({ActionKind::kForward, forward, s});
    for (; forward < num_microbatches; ++forward, ++backward) {
      list.push_back({ActionKind::kForward, forward, s});
      list.push_back({ActionKind::kBackward, backward, s});
    }
    for (; backward < num_microbatches; ++backward) {
      list.push_back({ActionKind::kBackward, backward, s});
    }
  });
}

Schedule zb1p_schedule(int64_t num_stages, int64_t num_microbatches) {
  return one_stage_per_worker(num_stages, num_microbatches, [&](int64_t s, auto& list) {
    const int64_t warmup = std::min(num_stages - 1 - s, num_microbatches);
    // Stage s gets its last gradient S - 1 - s steps after the last stage; deferring s weight
    // passes fills that wait, so every stage ends at about the same time.
    const int64_t deferred = s;
    int64_t forward = 0, backward = 0, weight = 0;
    const auto backward_then_weight = [&] {
      list.push_back({ActionKind::kBackwardInput, backward++, s});
      while (backward - weight > deferred)
        list.push_back({ActionKind::kBackwardWeight, weight++, s});
    };
    for (; forward < warmup; ++forward) list.push_back({ActionKind::kForward, forward, s});
    for (; forward < num_microbatches; ++forward) {
      list.push_back({ActionKind::kForward, forward, s});
      backward_then_weight();
    }
    while (backward < num_microbatches) backward_then_weight();
    while (weight < num_microbatches) list.push_back({ActionKind::kBackwardWeight, weight++, s});
  });
}

Schedule interleaved_one_f_one_b_schedule(int64_t num_workers, int64_t stages_per_worker,
                                          int64_t num_microbatches) {
  detail::check_stages(num_workers, stages_per_worker, num_microbatches);
  const int64_t W = num_workers;
  const int64_t v = stages_per_worker;
  const int64_t M = num_microbatches;
  const int64_t S = W * v;

  // Megatron-LM's orders of (chunk, micro-batch) on every worker: rounds of W micro-batches,
  // chunk by chunk; backwards with the chunks reversed.
  std::vector<std::pair<int64_t, int64_t>> forward_order;
  std::vector<std::pair<int64_t, int64_t>> backward_order;
  for (int64_t begin = 0; begin < M; begin += W) {
    const int64_t end = std::min(begin + W, M);
    for (const auto c : c10::irange(v)) {
      for (int64_t i = begin; i < end; ++i) forward_order.emplace_back(c, i);
    }
    for (int64_t c = v - 1; c >= 0; --c) {
      for (int64_t i = begin; i < end; ++i) backward_order.emplace_back(c, i);
    }
  }
  const int64_t total = M * v;

  // Simulates in unit-time ticks: a result computed at tick t is usable from tick t + 1.
  constexpr int64_t kNotYet = -1;
  std::vector<std::vector<int64_t>> forward_tick(S, std::vector<int64_t>(M, kNotYet));
  std::vector<std::vector<int64_t>> backward_tick(S, std::vector<int64_t>(M, kNotYet));
  std::vector<int64_t> forwards(W, 0);
  std::vector<int64_t> backwards(W, 0);
  std::vector<std::vector<Action>> computes(W);
  auto done_before = [](int64_t tick, int64_t now) { return tick != kNotYet && tick < now; };
  for (int64_t tick = 0, finished = 0; finished < W; ++tick) {
    bool progressed = false;
    for (int pass = 0; pass < 2 && !progressed; ++pass) {
      // The second pass, only when nothing could run, lifts the warm-up bound.
      const bool bounded = pass == 0;
      for (const auto w : c10::irange(W)) {
        if (backwards[w] == total) continue;
        bool forward_ready = false;
        int64_t fs = 0, fi = 0;
        if (forwards[w] < total) {
          fs = forward_order[forwards[w]].first * W + w;
          fi = forward_order[forwards[w]].second;
          forward_ready = fs == 0 || done_before(forward_tick[fs - 1][fi], tick);
        }
        const int64_t bs = backward_order[backwards[w]].first * W + w;
        const int64_t bi = backward_order[backwards[w]].second;
        const bool backward_ready =
            done_before(forward_tick[bs][bi], tick) &&
            (bs == S - 1 ? true : done_before(backward_tick[bs + 1][bi], tick));
        const int64_t limit = std::min(total, interleaved_warmup(W, v, w));
        const bool may_forward = !bounded || forwards[w] - backwards[w] < limit;
        if (forward_ready && may_forward) {
          forward_tick[fs][fi] = tick;
          computes[w].push_back({ActionKind::kForward, fi, fs});
          ++forwards[w];
          progressed = true;
        } else if (backward_ready) {
          backward_tick[bs][bi] = tick;
          computes[w].push_back({ActionKind::kBackward, bi, bs});
          if (++backwards[w] == total) ++finished;
          progressed = true;
        }
      }
    }
    // With the bound lifted the consistent orders always leave something to run.
    TORCH_INTERNAL_ASSERT(progressed, "interleaved 1F1B generator stalled at tick ", tick);
  }
  return with_communication(Schedule{W, S, M, Placement::kLooped, computes});
}

Schedule interleaved_zb1p_schedule(int64_t num_workers, int64_t stages_per_worker,
                                   int64_t num_microbatches) {
  detail::check_stages(num_workers, stages_per_worker, num_microbatches);
  const int64_t W = num_workers;
  const int64_t v = stages_per_worker;
  // Simulated, with interleaved 1F1B's warm-up bound on what a worker holds and W more
  // micro-batches waiting for their weight gradients, as ZB1P's last stage holds.
  Schedule simulated =
      detail::greedy_split_backward(W, v, num_microbatches, Placement::kLooped,
                                    [W, v](int64_t w) { return interleaved_warmup(W, v, w) + W; });
  // Interleaved 1F1B's order with each backward split: its input half where the backward was,
  // its weight half w input halves later on worker w (the lag torch.distributed.pipelining's
  // interleaved zero bubble gives it), so that each message has an action's time to arrive.
  const Schedule interleaved = interleaved_one_f_one_b_schedule(W, v, num_microbatches);
  std::vector<std::vector<Action>> computes(W);
  for (const auto w : c10::irange(W)) {
    std::deque<Action> deferred;
    for (const Action& a : interleaved.actions[w]) {
      if (a.kind == ActionKind::kForward) {
        computes[w].push_back(a);
      } else if (a.kind == ActionKind::kBackward) {
        computes[w].push_back({ActionKind::kBackwardInput, a.microbatch, a.stage});
        deferred.push_back({ActionKind::kBackwardWeight, a.microbatch, a.stage});
        if (static_cast<int64_t>(deferred.size()) > w) {
          computes[w].push_back(deferred.front());
          deferred.pop_front();
        }
      }
    }
    computes[w].insert(computes[w].end(), deferred.begin(), deferred.end());
  }
  return detail::faster_order(
      std::move(simulated),
      with_communication(Schedule{W, W * v, num_microbatches, Placement::kLooped, computes}));
}

Schedule looped_bfs_schedule(int64_t num_workers, int64_t stages_per_worker,
                             int64_t num_microbatches) {
  detail::check_stages(num_workers, stages_per_worker, num_microbatches);
  const int64_t W = num_workers, v = stages_per_worker, M = num_microbatches;
  std::vector<std::vector<Action>> computes(W);
  for (const auto w : c10::irange(W)) {
    for (const auto c : c10::irange(v)) {
      for (const auto i : c10::irange(M))
        computes[w].push_back({ActionKind::kForward, i, c * W + w});
    }
    for (int64_t c = v - 1; c >= 0; --c) {
      for (const auto i : c10::irange(M)) {
        computes[w].push_back({ActionKind::kBackward, i, c * W + w});
      }
    }
  }
  return with_communication(Schedule{W, W * v, M, Placement::kLooped, computes});
}

Schedule make_schedule(ScheduleKind kind, int64_t num_workers, int64_t num_stages,
                       int64_t num_microbatches) {
  detail::check_positive(num_workers, "num_workers");
  detail::check_positive(num_stages, "num_stages");
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZeroBubble:
      TORCH_CHECK_VALUE(num_stages == num_workers, "schedule ", kind,
                        " runs one stage per worker, but got ", num_stages, " stages for ",
                        num_workers, " workers");
      if (kind == ScheduleKind::kGPipe) return gpipe_schedule(num_stages, num_microbatches);
      if (kind == ScheduleKind::kOneFOneB) {
        return one_f_one_b_schedule(num_stages, num_microbatches);
      }
      return zb1p_schedule(num_stages, num_microbatches);
    case ScheduleKind::kInterleavedOneFOneB:
    case ScheduleKind::kInterleavedZeroBubble:
    case ScheduleKind::kLoopedBFS: {
      TORCH_CHECK_VALUE(num_stages % num_workers == 0, "schedule ", kind,
                        " needs the number of stages to be a multiple of the number of workers, "
                        "but got ",
                        num_stages, " stages for ", num_workers, " workers");
      const int64_t v = num_stages / num_workers;
      if (kind == ScheduleKind::kInterleavedOneFOneB) {
        return interleaved_one_f_one_b_schedule(num_workers, v, num_microbatches);
      }
      if (kind == ScheduleKind::kInterleavedZeroBubble) {
        return interleaved_zb1p_schedule(num_workers, v, num_microbatches);
      }
      return looped_bfs_schedule(num_workers, v, num_microbatches);
    }
    case ScheduleKind::kZeroBubbleV:
    case ScheduleKind::kDualPipeV:
    case ScheduleKind::kVMin:
    case ScheduleKind::kVHalf:
      TORCH_CHECK_VALUE(num_stages == 2 * num_workers, "schedule ", kind,
                        " runs two stages per worker in a V, but got ", num_stages, " stages for ",
                        num_workers, " workers");
      if (kind == ScheduleKind::kZeroBubbleV) return zbv_schedule(num_workers, num_microbatches);
      if (kind == ScheduleKind::kDualPipeV) {
        return dualpipev_schedule(num_workers, num_microbatches);
      }
      if (kind == ScheduleKind::kVMin) return v_min_schedule(num_workers, num_microbatches);
      return v_half_schedule(num_workers, num_microbatches);
  }
  TORCH_CHECK_VALUE(false, "unknown schedule kind ", static_cast<int>(kind));
}

}  // namespace schedule
}  // namespace gpipe

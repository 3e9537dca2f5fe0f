// V-Min and V-Half (generators.h): a building block of "Pipeline Parallelism with Controllable
// Memory" (Qi et al., 2024) repeated once per micro-batch and squeezed in unit-time ticks.
#include "gpipe/schedule/generators.h"

#include "schedule/generator_checks.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {
namespace {

// The ticks, from a block's start, at which worker w runs one micro-batch's forward on its down
// stage (w) and on its up stage (2W - 1 - w), then its input gradient on the up stage and on the
// down stage. The lifespan, from the first forward to the last input gradient, is what the block
// makes a worker hold.
struct Block {
  int64_t forward_down, forward_up, input_up, input_down;
};

// A worker computes F, B and W of two stages per micro-batch, a tick each: blocks start this
// many ticks apart. A worker's four passes fall on different ticks modulo it, so that blocks
// never collide, and its two other ticks are left to weight gradients.
constexpr int64_t kPeriod = 6;

// V-Min: each pass right after the one it needs - down the V one worker a tick, back up, then
// the gradient down the up stages and back up the down stages. Where 3 divides W the gradient
// starts 2 ticks later, else two of a worker's passes would share a tick modulo 6.
Block v_min_block(int64_t W, int64_t w) {
  const int64_t wait = W % 3 == 0 ? 2 : 0;
  return {w, 2 * W - 1 - w, 2 * W + wait + w, 4 * W - 1 + wait - w};
}

// V-Half: the passes going down the V (forwards of down stages, input gradients of up stages)
// take 2 ticks a worker, those coming back 1: a longer lifespan, for fewer waits. Where W is even
// the gradient starts 3 ticks later, for the same reason as V-Min's 2.
Block v_half_block(int64_t W, int64_t w) {
  const int64_t wait = W % 2 == 0 ? 3 : 0;
  return {2 * w, 3 * W - 2 - w, 3 * W - 1 + wait + 2 * w, 6 * W - 2 + wait - w};
}

using BlockOf = Block (*)(int64_t W, int64_t w);

// Each worker's forwards and input gradients in the order of their ticks once `block_of` repeats
// every kPeriod ticks for `M` micro-batches.
std::vector<std::vector<Action>> passes_in_block_order(int64_t W, int64_t M, BlockOf block_of) {
  std::vector<std::vector<Action>> passes(W);
  for (const auto w : c10::irange(W)) {
    const Block block = block_of(W, w);
    const int64_t down = w;
    const int64_t up = 2 * W - 1 - w;
    std::vector<std::pair<int64_t, Action>> timed;
    timed.reserve(4 * M);
    for (const auto i : c10::irange(M)) {
      const int64_t start = kPeriod * i;
      timed.push_back({start + block.forward_down, {ActionKind::kForward, i, down}});
      timed.push_back({start + block.forward_up, {ActionKind::kForward, i, up}});
      timed.push_back({start + block.input_up, {ActionKind::kBackwardInput, i, up}});
      timed.push_back({start + block.input_down, {ActionKind::kBackwardInput, i, down}});
    }
    std::sort(timed.begin(), timed.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    passes[w].reserve(timed.size());
    for (const auto& [tick, action] : timed) passes[w].push_back(action);
  }
  return passes;
}

// The V schedule of `block_of` in which a worker holds at most `limit` micro-batches (forwarded,
// weight gradient not computed yet). In unit-time ticks (a result of tick t is usable from tick
// t + 1) each worker runs its next pass in block order as soon as it is ready - a forward only
// below the limit - and otherwise a pending weight gradient, its up stage's first, oldest first.
// A limit of at least the repeated block's own peak never stalls: a forward held back by it finds
// weight gradients pending, since the block itself has run as many by then.
Schedule repeated_block(int64_t W, int64_t M, BlockOf block_of, int64_t limit) {
  const int64_t S = 2 * W;
  const auto passes = passes_in_block_order(W, M, block_of);
  constexpr int64_t kNotYet = -1;
  std::vector<int64_t> forward_tick(S * M, kNotYet), input_grad_tick(S * M, kNotYet);
  const auto cell = [M](int64_t stage, int64_t i) { return stage * M + i; };
  const auto done_before = [](int64_t tick, int64_t now) { return tick != kNotYet && tick < now; };
  const auto ready = [&](const Action& a, int64_t now) {
    if (a.kind == ActionKind::kForward) {
      return a.stage == 0 || done_before(forward_tick[cell(a.stage - 1, a.microbatch)], now);
    }
    return done_before(forward_tick[cell(a.stage, a.microbatch)], now) &&
           (a.stage == S - 1 || done_before(input_grad_tick[cell(a.stage + 1, a.microbatch)], now));
  };
  std::vector<size_t> next(W, 0);
  std::vector<int64_t> held(W, 0);
  std::vector<std::deque<int64_t>> weights_up(W), weights_down(W);  // micro-batches, oldest first
  std::vector<std::vector<Action>> computes(W);
  const size_t per_worker = static_cast<size_t>(kPeriod * M);
  for (int64_t tick = 0, finished = 0; finished < W; ++tick) {
    bool progressed = false;
    for (const auto w : c10::irange(W)) {
      if (computes[w].size() == per_worker) continue;
      std::optional<Action> run;
      if (next[w] < passes[w].size()) {
        const Action& pass = passes[w][next[w]];
        if (ready(pass, tick) && (pass.kind != ActionKind::kForward || held[w] < limit)) {
          run = pass;
          ++next[w];
        }
      }
      for (auto* weights : {&weights_up[w], &weights_down[w]}) {
        if (run || weights->empty()) continue;
        const int64_t stage = weights == &weights_up[w] ? S - 1 - w : w;
        run = Action{ActionKind::kBackwardWeight, weights->front(), stage};
        weights->pop_front();
      }
      if (!run) continue;
      const int64_t at = cell(run->stage, run->microbatch);
      if (run->kind == ActionKind::kForward) {
        forward_tick[at] = tick;
        ++held[w];
      } else if (run->kind == ActionKind::kBackwardInput) {
        input_grad_tick[at] = tick;
        (run->stage == w ? weights_down[w] : weights_up[w]).push_back(run->microbatch);
      } else {
        --held[w];
      }
      computes[w].push_back(*run);
      if (computes[w].size() == per_worker) ++finished;
      progressed = true;
    }
    TORCH_INTERNAL_ASSERT(progressed, "V-shape block generator stalled at tick ", tick);
  }
  return with_communication(Schedule{W, S, M, Placement::kV, computes});
}

}  // namespace

Schedule v_min_schedule(int64_t num_workers, int64_t num_microbatches) {
  detail::check_v_size(num_workers, num_microbatches);
  // The block's peak: the paper's (W + 4) / 3 micro-batches of whole stages, in half-size ones.
  return repeated_block(num_workers, num_microbatches, v_min_block, 2 * ((num_workers + 4) / 3));
}

Schedule v_half_schedule(int64_t num_workers, int64_t num_microbatches) {
  detail::check_v_size(num_workers, num_microbatches);
  // The block's peak: the paper's (W + 2) / 2 micro-batches of whole stages, in half-size ones.
  return repeated_block(num_workers, num_microbatches, v_half_block, 2 * ((num_workers + 2) / 2));
}

}  // namespace schedule
}  // namespace gpipe

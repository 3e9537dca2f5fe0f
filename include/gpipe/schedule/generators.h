// Schedule generators: GPipe (fill-drain), 1F1B, interleaved 1F1B, looped BFS, the zero-bubble
// ZB1P, interleaved ZB1P and ZBV, DualPipeV, and the memory-bounded V-Min and V-Half, as lists of
// actions.
//
// Every generator places the receive of a tensor right before the compute that uses it and the
// send right after the compute that produces it, so a worker blocks only when its input has not
// arrived yet. Backward runs micro-batches in increasing order on every stage.
//
//   GPipe: every stage runs all M forwards, then all M backwards. Stage 0 holds the activations of
//     all M micro-batches at once.
//   1F1B: stage s runs min(S - 1 - s, M) warm-up forwards, then alternates one forward and one
//     backward, then drains the remaining backwards. Stage s holds at most S - s micro-batches.
//   Interleaved 1F1B: each of W workers runs v stages (s, s + W, ...). Forwards go in rounds of W
//     micro-batches (the last round may be smaller), chunk by chunk (Megatron-LM's order),
//     backwards likewise with the chunks reversed. Worker w keeps at most
//     (W - w - 1) * 2 + (v - 1) * W + 1 forwards ahead of its backwards (Megatron-LM's warm-up
//     plus one): below that bound it runs its next forward if ready, otherwise its next backward
//     if ready. The interleaving comes from a unit-time simulation of all workers, which lifts
//     the bound only in a tick where nothing else could run. The bubble shrinks by about v. It
//     sends ahead, so it needs edge queues of more than one message (the runtime gives M).
//   ZB1P (ZB-H1 of "Zero Bubble Pipeline Parallelism", Qi et al., 2023): 1F1B's order with each
//     backward split into B (input gradient, sent upstream at once) and W (weight gradient, local).
//     Stage s runs W of micro-batch j after B of micro-batch j + s (the last s at the end): the
//     last stage, which finishes its B's first, defers the most W's, and they fill the cooldown
//     waits that 1F1B leaves idle. Stage s holds at most S micro-batches (S - s not yet through B,
//     s more waiting for W), as 1F1B's stage 0 does.
//   ZBV (ZB-V of "Pipeline Parallelism with Controllable Memory", Qi et al., 2024): 2W stages on
//     W workers in a V (action.h), backwards split as in ZB1P. Worker 0 computes the loss right
//     after the first stage's forward, so backwards start W stages sooner than in 1F1B. Each
//     worker, at each unit-time tick of a simulation, runs the input gradient of its oldest
//     micro-batch that is ready (the critical path), else a forward (the stage nearer the loss
//     first) while it holds fewer than 2W micro-batches of its stages - half-size stages, so the
//     memory of 1F1B's first stage - else its oldest pending weight gradient; the bound lifts
//     only in a tick where nothing else could run. With unit costs its bubble vanishes as M grows
//     past 2W (docs/schedules.md).
//   DualPipeV (DeepSeek's DualPipe folded into a V, as torch.distributed.pipelining has it): ZBV's
//     stages; after a warm-up of forwards, each worker pairs the forward of one of its stages with
//     the backward of the other (F down + B up, F up + B down), the pairs DualPipe overlaps with
//     each other's communication; here a pair runs back to back. Backwards are whole until the
//     cooldown, whose second half splits them and fills the gaps with weight gradients. Needs
//     M >= 2W.
//   V-Min and V-Half (of "Pipeline Parallelism with Controllable Memory", Qi et al., 2024): ZBV's
//     stages and split backwards, built from the paper's building block - the ticks at which each
//     worker runs one micro-batch's four passes (forward down, forward up, input gradient up,
//     input gradient down) - repeated every 6 ticks, a worker's F, B and W of two stages. The
//     block's lifespan decides the memory: each worker runs its forwards and input gradients in
//     the repeated block's order, each as soon as it is ready, a forward only while it holds
//     fewer micro-batches than the block's peak; in the other ticks it runs a pending weight
//     gradient (its up stage's first, oldest first).
//   V-Min: every pass of the block follows the one it needs at once (the input gradient 2 ticks
//     later where 3 divides W, so that a worker's four passes fall on different ticks of 6). A
//     worker holds at most 2 * floor((W + 4) / 3) half-size micro-batches, about a third of
//     1F1B's first stage; with unit costs a step takes 6M + 4W - 5 ticks (+2 where 3 divides W),
//     the bubble about 2W / 3M.
//   V-Half: the passes going down the V take 2 ticks per worker, those coming back 1 (the input
//     gradient 3 ticks later where W is even), so a micro-batch lives longer: a worker holds at
//     most 2 * floor((W + 2) / 2), about half of 1F1B's first stage, and with unit costs the
//     bubble is about W / 2M.
//
// Thread safety: pure functions.
#pragma once

#include "gpipe/checkpoint.h"
#include "gpipe/schedule/action.h"
#include "gpipe/schedule/schedule_kind.h"

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace gpipe {
namespace schedule {

/// `computes`, a schedule of compute actions only, with each one's receives right before it and
/// its sends right after, as every generator places them. Throws c10::ValueError for an action
/// that is not a compute.
Schedule with_communication(const Schedule& computes);

/// GPipe over `num_stages` stages (one per worker) and `num_microbatches` micro-batches.
/// Throws c10::ValueError unless both are positive.
Schedule gpipe_schedule(int64_t num_stages, int64_t num_microbatches);

/// 1F1B over `num_stages` stages (one per worker). Throws c10::ValueError unless both are
/// positive.
Schedule one_f_one_b_schedule(int64_t num_stages, int64_t num_microbatches);

/// ZB1P over `num_stages` stages (one per worker): kBackwardInput and kBackwardWeight instead of
/// kBackward. Throws c10::ValueError unless both are positive.
Schedule zb1p_schedule(int64_t num_stages, int64_t num_microbatches);

/// Interleaved 1F1B: `num_workers` workers with `stages_per_worker` stages each. Throws
/// c10::ValueError unless all three are positive.
Schedule interleaved_one_f_one_b_schedule(int64_t num_workers, int64_t stages_per_worker,
                                          int64_t num_microbatches);

/// ZBV: `num_workers` workers with two stages each in a V (Placement::kV); of a simulated order
/// and ZB-V's phases, the faster (docs/schedules.md). Throws c10::ValueError unless both are
/// positive.
Schedule zbv_schedule(int64_t num_workers, int64_t num_microbatches);

/// DualPipeV: `num_workers` workers with two stages each in a V (Placement::kV). Throws
/// c10::ValueError unless both are positive and num_microbatches >= 2 * num_workers.
Schedule dualpipev_schedule(int64_t num_workers, int64_t num_microbatches);

/// V-Min: `num_workers` workers with two stages each in a V (Placement::kV), holding at most
/// 2 * floor((num_workers + 4) / 3) micro-batches of their stages. Throws c10::ValueError unless
/// both are positive.
Schedule v_min_schedule(int64_t num_workers, int64_t num_microbatches);

/// V-Half: as V-Min, holding at most 2 * floor((num_workers + 2) / 2) micro-batches of their
/// stages for a smaller bubble. Throws c10::ValueError unless both are positive.
Schedule v_half_schedule(int64_t num_workers, int64_t num_microbatches);

/// Interleaved ZB1P: interleaved 1F1B's looped stages with backwards split as in ZB1P; of a
/// simulated order (a worker holding at most interleaved 1F1B's warm-up bound plus W
/// micro-batches waiting for their weight gradients) and interleaved 1F1B's order with each
/// backward split, the faster (docs/schedules.md). Throws c10::ValueError unless all three are
/// positive.
Schedule interleaved_zb1p_schedule(int64_t num_workers, int64_t stages_per_worker,
                                   int64_t num_microbatches);

/// Looped BFS: looped stages; each worker runs all forwards of its first stage, then of its next,
/// and the backwards in reverse (GPipe over looped stages: every stage holds all M micro-batches).
/// Throws c10::ValueError unless all three are positive.
Schedule looped_bfs_schedule(int64_t num_workers, int64_t stages_per_worker,
                             int64_t num_microbatches);

/// The schedule of `kind` for `num_stages` stages on `num_workers` workers. GPipe, 1F1B and ZB1P
/// need num_stages == num_workers; interleaved 1F1B and ZB1P and looped BFS need num_stages to
/// be a multiple of num_workers; ZBV, DualPipeV, V-Min and V-Half need num_stages ==
/// 2 * num_workers. Throws
/// c10::ValueError otherwise.
Schedule make_schedule(ScheduleKind kind, int64_t num_workers, int64_t num_stages,
                       int64_t num_microbatches);

}  // namespace schedule
}  // namespace gpipe

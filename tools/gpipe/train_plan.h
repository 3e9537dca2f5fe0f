// gpipe train --plan: the planner (gpipe/plan.h) on the char GPT that `gpipe train` would
// train, for its workers (--stages / --virtual-stages worker threads, or one per rank) within
// --memory-budget (parameters, gradients and AdamW's two moments, plus activations, per
// worker). `--plan show` (and `gpipe plan`) prints the ranked plans and the choice;
// `--plan auto` then trains with the choice: its schedule, stages per worker, micro-batches,
// checkpointing and balance.
#pragma once

#include "train.h"

#include <gpipe/plan.h>

#include <ostream>

namespace gpipe {
namespace cli {

/// Profiles the model and batch of `c` and plans, printing the report and the choice to `out`.
/// On ranks (`ranks`, met by meet_ranks), rank 0 plans for one worker per rank, as worker
/// threads of its process, and prints; the others wait for its choice through the store.
/// Throws c10::ValueError, with every family's reason, if no plan fits; on the other ranks,
/// c10::Error with rank 0's message.
Plan plan_training(const TrainConfig& c, std::ostream& out,
                   const distributed::ProcessGroup* ranks = nullptr);

/// `c` with `plan`'s schedule, stages, stages per worker, micro-batches, checkpointing and
/// balance.
TrainConfig with_plan(TrainConfig c, const Plan& plan);

}  // namespace cli
}  // namespace gpipe

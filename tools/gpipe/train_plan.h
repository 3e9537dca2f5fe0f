// gpipe train --plan: the planner (gpipe/plan.h) on the char GPT that `gpipe train` would
// train, for its workers (--stages / --virtual-stages worker threads) within --memory-budget
// (parameters, gradients and AdamW's two moments, plus activations, per worker). `--plan show`
// (and `gpipe plan`) prints the ranked plans and the choice; `--plan auto` then trains with the
// choice: its schedule, stages per worker, micro-batches, checkpointing and balance.
#pragma once

#include "train.h"

#include <gpipe/plan.h>

#include <ostream>

namespace gpipe {
namespace cli {

/// Profiles the model and batch of `c` and plans, printing the report and the choice to `out`.
/// Throws UsageError on ranks (it plans threads of one process) and c10::ValueError, with every
/// family's reason, if no plan fits.
Plan plan_training(const TrainConfig& c, std::ostream& out);

/// `c` with `plan`'s schedule, stages, stages per worker, micro-batches, checkpointing and
/// balance.
TrainConfig with_plan(TrainConfig c, const Plan& plan);

}  // namespace cli
}  // namespace gpipe

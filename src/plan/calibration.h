// How much slower a layer runs inside a pipeline than alone: the planner's calibration.
//
// Each layer is profiled alone (layer_costs.h), on one busy thread. Inside a pipeline the
// workers run side by side, and on a shared or virtual machine that costs more than the
// arithmetic: on this project's 2-vCPU machine, a char GPT stage of 2 workers took 1.3-2x as
// long as its layers alone, and its wall time grew more than its CPU time (the host serves two
// busy vCPUs less well than one); more workers than cores share them. So the planner trains
// the model for a few GPipe steps on its workers, one stage each, and compares each stage's
// forward and backward, as traced, with the sum of its layers' profiled costs.
#pragma once

#include "gpipe/microbatch.h"
#include "gpipe/plan.h"
#include "plan/layer_costs.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <map>
#include <vector>

namespace gpipe {
namespace plan_detail {

/// Half the sum of the squared outputs: the loss a model is calibrated with where plan() has
/// none. Its gradient is the output, as the profile's backward receives it (layer_costs.cpp).
/// Throws c10::ValueError for an output with no floating-point tensor.
at::Tensor half_squares(const Batch& output, const Batch& target);

/// Measured over profiled, for each micro-batch count of `profiles` (the profile of one such
/// micro-batch per count). Trains `model` on `sample` and `target` (a whole mini-batch, on the
/// CPU) with `loss` and GPipe on `workers` worker threads (fewer where the model has fewer
/// layers) of `threads` intra-op threads each, cut where the count's profile balances
/// time: one step per count, then `steps` traced steps of each, the counts taking turns. The
/// last stage's profiled costs include the loss's. With `cores` (> 0) the workers shared that
/// many: each action counts what it would have taken alone (costs_from_trace), so that the
/// factors say how much slower a layer runs in a pipeline, not how crowded this one was. The
/// model is left as it was: values, buffers, modes, no gradients.
std::vector<Calibration> calibrate(torch::nn::Sequential model, const Batch& sample,
                                   const Batch& target, const schedule::LossFunction& loss,
                                   int64_t workers, int64_t threads, int64_t cores,
                                   const std::map<int64_t, ModelCosts>& profiles, int64_t steps);

/// `costs` with their times, the loss's included, multiplied by `calibration`'s factors (a
/// split backward's halves by the backward's).
void apply(const Calibration& calibration, ModelCosts& costs);

}  // namespace plan_detail
}  // namespace gpipe

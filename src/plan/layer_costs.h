// What each layer of a Sequential costs for one micro-batch: the planner's profile (plan.h).
#pragma once

#include "gpipe/microbatch.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <vector>

namespace gpipe {
namespace plan_detail {

struct LayerCosts {
  /// Seconds: the forward, and the backward's two halves, the gradient of the layer's input
  /// (what goes upstream) and of its parameters (what a zero-bubble schedule defers).
  double forward = 0, backward_input = 0, backward_weight = 0;
  /// Bytes the forward leaves allocated until backward: its output and what it saved.
  int64_t activation_bytes = 0;
  /// Bytes of the layer's input: what a checkpoint keeps, what a stage starting here receives.
  int64_t input_bytes = 0;
  /// Bytes of its parameters (each storage once).
  int64_t parameter_bytes = 0;
};

/// Each layer's costs on `microbatch` as fed through the layers before it, in training mode
/// with grad enabled, on the micro-batch's device; times are medians over `repetitions`
/// passes. Each layer runs on a copy (balance/layer_sandbox.h); memory is measured with the
/// tracking allocator on the CPU (installed if it was not), the caching allocator on CUDA.
std::vector<LayerCosts> profile_layer_costs(torch::nn::Sequential model, const Batch& microbatch,
                                            int64_t repetitions);

}  // namespace plan_detail
}  // namespace gpipe

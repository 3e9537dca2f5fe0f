// What each layer of a Sequential costs for one micro-batch: the planner's profile (plan.h).
#pragma once

#include "gpipe/microbatch.h"
#include "gpipe/schedule/stage.h"
#include "plan/tied_memory.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <vector>

namespace gpipe {
namespace plan_detail {

struct LayerCosts {
  /// Seconds: the forward; the whole backward; and the backward split as a zero-bubble schedule
  /// splits it, the gradient of the layer's input (what goes upstream) and of its parameters
  /// (what it defers).
  double forward = 0, backward = 0, backward_input = 0, backward_weight = 0;
  /// Bytes the forward leaves allocated until backward: its output and what it saved.
  int64_t activation_bytes = 0;
  /// What the layer adds where it follows another layer of a stage: activation_bytes less its
  /// input's bytes where nothing the layer saved keeps the input. May be negative.
  int64_t chained_activation_bytes = 0;
  /// Bytes more that a split backward holds between its halves: the gradients captured for the
  /// weight half, less what only the input half needed. May be negative.
  int64_t weight_pending_bytes = 0;
  /// As weight_pending_bytes, where the layer follows another layer of a stage: its input half
  /// also lets go of the layer's input where only it needed it. May be negative.
  int64_t chained_weight_pending_bytes = 0;
  /// Bytes its backward allocates above what it started with while it runs (the gradient of
  /// its input, workspace), the gradient of its output given.
  int64_t backward_transient_bytes = 0;
  /// Bytes a split backward's input half allocates above what it started with while it runs,
  /// the gradient of the layer's output included: it keeps the graph whole until it ends.
  int64_t input_half_transient_bytes = 0;
  /// Bytes its forward allocates above what it keeps, at their most (workspace, temporaries).
  int64_t forward_transient_bytes = 0;
  /// Bytes the weight half allocates above what it started with while it runs (the parameters'
  /// gradients allocated already, as a step finds them).
  int64_t weight_half_transient_bytes = 0;
  /// Bytes of the gradients the input half captures for the weight half: a stage's input half
  /// keeps each layer's while it runs the layers before.
  int64_t captured_gradient_bytes = 0;
  /// Bytes of the layer's input: what a checkpoint keeps, what a stage starting here receives.
  int64_t input_bytes = 0;
  /// Bytes of its output: on the last stage, what the loss's gradient of it takes.
  int64_t output_bytes = 0;
  /// Bytes of its parameters (each storage once).
  int64_t parameter_bytes = 0;
  /// The skip tensors it pops that carry gradients: which layer stashed each, and its bytes,
  /// which its backward sends back there as a gradient.
  struct Popped {
    int64_t stashed_by = 0;
    int64_t bytes = 0;
  };
  std::vector<Popped> popped;
};

/// What a model costs for one micro-batch: its layers', and its loss's as a layer after the
/// last (forward, backward - its backward_input too, its backward_weight 0 -, activation_bytes:
/// what its forward keeps until backward, backward_transient_bytes: what its backward
/// allocates, the gradient of the output included).
struct ModelCosts {
  std::vector<LayerCosts> layers;
  LayerCosts loss;
  /// The parameters that more than one layer holds.
  std::vector<TiedParameter> tied;
};

/// Each layer's costs on `microbatch` as fed through the layers before it, in training mode
/// with grad enabled, on the micro-batch's device; times are medians over `repetitions`
/// passes. Each layer runs on a copy (balance/layer_sandbox.h); memory is measured with the
/// tracking allocator on the CPU (installed if it was not), the caching allocator on CUDA.
/// Sets `last_output`, where given, to the last layer's output, detached.
std::vector<LayerCosts> profile_layer_costs(torch::nn::Sequential model, const Batch& microbatch,
                                            int64_t repetitions, Batch* last_output = nullptr);

/// The loss's costs, as the last stage runs it (Stage::forward_loss, then its backward) on the
/// model's `output` for one micro-batch and that micro-batch's `target`, scaled by `scale` (the
/// micro-batch's share of the mini-batch, as a mean's reduction scales it); times are medians
/// over `repetitions` passes. Throws c10::ValueError if the loss does not return a scalar.
LayerCosts profile_loss_costs(const Batch& output, const Batch& target,
                              const schedule::LossFunction& loss, double scale,
                              int64_t repetitions);

}  // namespace plan_detail
}  // namespace gpipe

// Stage: one piece of a model in a pipeline schedule, with its own autograd graph per
// micro-batch, cut at the stage's boundaries.
//
// forward() detaches the tensors it receives from the previous stage and makes the floating-point
// ones require grad, so the graph of each micro-batch ends at the stage's input; backward() runs
// that graph with the gradient of the output from the next stage and returns the gradient of the
// input, which goes back upstream. The parameters accumulate their gradients across micro-batches
// as in one backward of the full batch. The first stage takes the user's input as it is; the last
// computes the loss, scaled by the micro-batch's share of the batch (see runtime.h).
//
// Split backward (zero-bubble schedules): backward_input() computes only the gradient of the
// input, which the previous stage waits for, and keeps the graph; backward_weight() later computes
// the parameters' gradients and frees the graph. Together they give what backward() gives. The
// split point is each autograd node where the input's path and a parameter's path part (e.g. a
// Linear's AddmmBackward): backward_input() runs the graph towards the input only, capturing the
// gradient that reaches each such node, and backward_weight() runs from those nodes towards the
// parameters only. The first stage has no input gradient to send, so its backward_input() does
// nothing and its backward_weight() runs the whole backward.
//
// Skips across stages (skip/skippable.h): a stage runs its layers with a skip tracker of its own.
// The tensors it pops that an earlier stage stashed come into forward() beside its input, as
// leaves that take a gradient like the input; those it stashes for a later stage leave forward()
// beside its output, detached, and their gradients come into backward() beside the output's. So
// a skip's gradient reaches the stage that stashed it without passing the stages between, and a
// checkpointed forward treats skips as more inputs and outputs.
//
// Thread safety: a Stage is used by one thread at a time (the worker that runs it), so its state
// needs no lock.
#pragma once

#include "gpipe/checkpoint.h"
#include "gpipe/microbatch.h"
#include "gpipe/skip/layout.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace gpipe {

class DeferredBatchNormImpl;

namespace schedule {

/// Computes the loss of one micro-batch from the last stage's output and the target; returns a
/// scalar.
using LossFunction = std::function<at::Tensor(const Batch& output, const Batch& target)>;

/// Tensors of skip connections that cross a stage's boundaries, or their gradients: one per
/// route of Stage::skip_pops() or Stage::skip_stashes(), in order.
using SkipTensors = std::vector<at::Tensor>;

/// One stage of a pipeline schedule.
class Stage {
 public:
  /// Stage `index` of `num_stages`, running `module` on `device`. A checkpointed forward
  /// (`checkpoint`: kAlways, or kExceptLast for all but the step's last micro-batch, see
  /// begin_step) keeps no activations inside the module; backward recomputes them. `skips`: the
  /// layout of the whole pipeline's skips, if any cross stages.
  Stage(int64_t index, int64_t num_stages, torch::nn::Sequential module, c10::Device device,
        CheckpointMode checkpoint, const skip::SkipLayout* skips = nullptr);
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  int64_t index() const { return index_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ == num_stages_ - 1; }
  const c10::Device& device() const { return device_; }
  torch::nn::Sequential& module() { return module_; }

  /// The skips this stage pops that earlier stages stash, sorted by stashing stage, then key;
  /// and those it stashes that later stages pop, sorted by popping stage, then key.
  const std::vector<skip::SkipRoute>& skip_pops() const { return skip_pops_; }
  const std::vector<skip::SkipRoute>& skip_stashes() const { return skip_stashes_; }

  /// Forward of `microbatch` on `input` and the tensors it pops from earlier stages, keeping its
  /// graph until backward(). Returns the output, detached, to send on, and sets `stashed` to the
  /// tensors stashed for later stages, detached. Throws c10::ValueError for a wrong number of
  /// popped tensors, or c10::Error if the layers leave a skip of another stage unstashed.
  /// REQUIRES: !is_last().
  Batch forward(int64_t microbatch, const Batch& input, const SkipTensors& popped = {},
                SkipTensors* stashed = nullptr);

  /// Forward of `microbatch` on the last stage, then loss(output, target) * scale, kept for
  /// backward(). Returns the scaled loss, detached. Throws c10::ValueError if the loss is not a
  /// scalar. REQUIRES: is_last().
  at::Tensor forward_loss(int64_t microbatch, const Batch& input, const Batch& target,
                          const LossFunction& loss, double scale, const SkipTensors& popped = {});

  /// Forward of `microbatch` for an evaluation: under no-grad, keeping nothing. Returns the
  /// output and sets `stashed` to the tensors stashed for later stages, as forward() does, on
  /// any stage (the last one's output is the model's). Throws like forward().
  Batch forward_only(int64_t microbatch, const Batch& input, const SkipTensors& popped = {},
                     SkipTensors* stashed = nullptr);

  /// loss(output, target) * scale, `target` moved to this stage's device. Throws c10::ValueError
  /// if the loss is not a scalar.
  at::Tensor loss(const Batch& output, const Batch& target, const LossFunction& loss,
                  double scale) const;

  /// Backward of `microbatch` with the gradient of its output (ignored by the last stage, which
  /// starts at its loss) and of the tensors it stashed for later stages. Returns the gradient of
  /// the input, an undefined tensor for an input without one; nothing for the first stage; sets
  /// `popped_grads` to the gradients of the tensors it popped. Frees the micro-batch's graph.
  /// Throws c10::ValueError if `microbatch` has no forward pending.
  Batch backward(int64_t microbatch, const Batch& grad_output,
                 const SkipTensors& stashed_grads = {}, SkipTensors* popped_grads = nullptr);

  /// The first half of backward(): the gradients of the input and of the popped tensors of
  /// `microbatch`, given like backward()'s; the parameters' gradients wait for
  /// backward_weight(). Keeps the graph. Throws c10::ValueError if `microbatch` has no forward
  /// pending or already ran this.
  Batch backward_input(int64_t microbatch, const Batch& grad_output,
                       const SkipTensors& stashed_grads = {}, SkipTensors* popped_grads = nullptr);

  /// The second half: accumulates the parameters' gradients of `microbatch` as backward() would,
  /// then frees its graph. Throws c10::ValueError if backward_input() of it has not run.
  void backward_weight(int64_t microbatch);

  /// Drops every pending micro-batch, e.g. after a failed step.
  void clear();

  /// The most micro-batches whose graphs this stage held at once since begin_step().
  int64_t peak_live_microbatches() const { return peak_live_; }

  /// Starts a step of `num_microbatches` micro-batches: the last of them is the one
  /// CheckpointMode::kExceptLast spares (until the first call, none is), the live peak starts
  /// anew, and in training the stage's DeferredBatchNorms (batchnorm.h) commit their statistics
  /// after that many micro-batches. The last stage's backwards start from `loss_scale` (a grad
  /// scaler's, amp/grad_scaler.h) instead of 1.
  void begin_step(int64_t num_microbatches, double loss_scale = 1.0);

 private:
  // A micro-batch between its forward and its backward: the ends of its graph (stage.cpp).
  struct Pending;

  // The stage's outputs and stashed tensors that take a gradient, with their gradients (the
  // last stage: its loss).
  void backward_roots(int64_t microbatch, const Pending& pending, const Batch& grad_output,
                      const SkipTensors& stashed_grads, std::vector<at::Tensor>* outputs,
                      std::vector<at::Tensor>* grads) const;
  Pending& find_pending(int64_t microbatch, const char* what);

  // Prepares the input and popped tensors of `microbatch` and runs the layers on them
  // (checkpointed or not): everything of a Pending but the gradients' state.
  Pending run(int64_t microbatch, const Batch& input, const SkipTensors& popped);
  Batch prepare_input(const Batch& input) const;
  // `input` on this stage's device, as it is.
  Batch on_device(const Batch& input) const;
  void keep(int64_t microbatch, Pending pending);

  int64_t index_;
  int64_t num_stages_;
  torch::nn::Sequential module_;
  c10::Device device_;
  CheckpointMode checkpoint_;
  std::vector<skip::SkipRoute> skip_pops_;
  std::vector<skip::SkipRoute> skip_stashes_;
  int64_t num_microbatches_ = -1;
  double loss_scale_ = 1.0;
  std::vector<std::shared_ptr<DeferredBatchNormImpl>> deferred_batch_norms_;
  std::map<int64_t, std::unique_ptr<Pending>> pending_;
  int64_t peak_live_ = 0;
};

}  // namespace schedule
}  // namespace gpipe

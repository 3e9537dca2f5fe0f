// Portal: carries a skip tensor between partitions outside the main autograd lane, with its
// gradient coming back the same way.
//
//   stash partition           fence of the pop partition        pop partition
//   tensor ─ PortalBlue ┐     ┌ PortalCopy ┐                ┌ PortalOrange ─ tensor' ─ layer
//   ───────────────── Join ─ Fork ────── Join ─ (Copy) ─── Fork ───────────────────────────
//
// blue() hides the tensor in the portal and returns a phony that the stash partition joins into
// its output; copy() moves the hidden tensor to the pop partition's device; orange() takes it out
// again behind a phony forked from the pop partition's input. In backward the fork/join edges
// order the three: PortalOrange stores the gradient of the popped tensor, PortalCopy moves it
// back, PortalBlue hands it to the stashed tensor (none if the popped tensor reached no loss).
// Nothing but phonies crosses the main lane, so the skip tensor is never copied through the
// partitions in between.
//
// Tensor life: the portal drops its tensor after `tensor_life` uses (blue, orange, and again
// orange and blue when a checkpointed micro-batch is recomputed), so a stashed tensor is freed as
// soon as nothing will read it again. See SkipTrackerThroughPortals for the counts.
//
// Thread safety: the uses of one portal are ordered by the pipeline (forward) and by autograd
// (backward), never concurrent; it needs no lock.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>

#include <cstdint>

namespace gpipe {
namespace skip {

/// A portal for one skip tensor of one micro-batch.
class Portal : public torch::CustomClassHolder {
 public:
  /// Holds `tensor` (may be undefined) for `tensor_life` uses.
  Portal(at::Tensor tensor, int64_t tensor_life);

  /// Hides the tensor (one use); returns a phony to join into the main lane. The phony
  /// requires grad when the tensor does.
  at::Tensor blue();

  /// Retrieves the tensor (one use) behind `phony`, forked from the main lane, so that its
  /// gradient comes back through the portal. Undefined for an undefined tensor. Throws
  /// c10::Error once the tensor life is spent.
  at::Tensor orange(const at::Tensor& phony);

  /// Copies the hidden tensor from `prev`'s device to `next`'s (and, in backward, its gradient
  /// back); returns a phony on `next`'s device to join into the main lane.
  at::Tensor copy(const c10::Stream& prev, const c10::Stream& next, const at::Tensor& phony);

  /// Throws c10::Error "tensor in portal has been removed" once the tensor life is spent.
  void check_tensor_life() const;

  /// Holds `tensor` for `tensor_life` more uses (none: drops it).
  void put_tensor(at::Tensor tensor, int64_t tensor_life);

  /// Returns the tensor and spends one use; the last use drops it.
  at::Tensor use_tensor();

  /// Keeps the gradient of the popped tensor until PortalBlue takes it.
  void put_grad(at::Tensor grad);
  /// Takes the gradient out. Throws c10::Error if there is none.
  at::Tensor use_grad();
  bool has_grad() const { return grad_.defined(); }

  const at::Tensor& tensor() const { return tensor_; }
  int64_t tensor_life() const { return tensor_life_; }

  /// Replaces the hidden tensor without spending a use (PortalCopy).
  void replace_tensor(at::Tensor tensor) { tensor_ = std::move(tensor); }

 private:
  at::Tensor tensor_;
  int64_t tensor_life_ = 0;
  at::Tensor grad_;
};

}  // namespace skip
}  // namespace gpipe

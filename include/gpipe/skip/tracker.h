// Skip trackers: where stash() puts a tensor and pop() finds it.
//
// Each thread has a current SkipTracker. By default it is a plain one, a map from skip key to
// tensor, which is all a Sequential run on one thread needs. GPipe gives every micro-batch a
// SkipTrackerThroughPortals and makes it current while a partition of that micro-batch runs:
// skips within a partition still go through the map, and skips between partitions go through
// portals (portal.h), one per skip and micro-batch:
//
//   open(input, j)     before partition j: takes out of their portals the tensors j pops
//   save / load        stash() and pop() inside the partition's layers
//   close(output, j)   after partition j: checks that its layers stashed and popped everything
//                      they declared, and hides the tensors it stashed in portals
//   copy(batch, ...)   at the fence of the popping partition: moves a hidden tensor to its device
//
// Tensor life of a portal (uses: blue in close(), orange in open()): 2 without checkpointing
// (blue, orange: the tensor is freed once popped); 3 for a checkpointed micro-batch (blue,
// orange, the recomputed orange), then 1 more for the recomputed blue, which hides the
// recomputed tensor again so that its gradient reaches the recomputed graph.
//
// Thread safety: a tracker belongs to one micro-batch, whose partitions run one after another
// (forward in clock order, backward in autograd's order); it is never used concurrently. The
// current tracker is thread-local.
#pragma once

#include "gpipe/microbatch.h"
#include "gpipe/skip/layout.h"
#include "gpipe/skip/namespace.h"
#include "gpipe/skip/portal.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstddef>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace gpipe {
namespace skip {

/// Keeps stashed tensors until they are popped.
class SkipTracker {
 public:
  virtual ~SkipTracker() = default;

  /// Keeps `tensor` (may be undefined) under `key`, replacing what was there.
  virtual void save(const SkipKey& key, at::Tensor tensor);

  /// Takes out the tensor under `key`. Throws c10::Error "'name' has not been stashed" if there
  /// is none.
  virtual at::Tensor load(const SkipKey& key);

  /// The tensors stashed and not popped yet (for a tracker through portals: those of skips
  /// within a partition).
  const std::map<SkipKey, at::Tensor>& tensors() const { return tensors_; }

 protected:
  std::map<SkipKey, at::Tensor> tensors_;
};

/// The calling thread's current tracker; a plain SkipTracker of its own unless one was set.
std::shared_ptr<SkipTracker> current_skip_tracker();

/// Makes `tracker` the calling thread's current tracker for a scope.
class UseSkipTracker {
 public:
  explicit UseSkipTracker(std::shared_ptr<SkipTracker> tracker);
  ~UseSkipTracker();
  UseSkipTracker(const UseSkipTracker&) = delete;
  UseSkipTracker& operator=(const UseSkipTracker&) = delete;

 private:
  std::shared_ptr<SkipTracker> previous_;
};

/// The tracker of one micro-batch under GPipe: skips between partitions go through portals. See
/// the file comment for the order of calls.
class SkipTrackerThroughPortals : public SkipTracker {
 public:
  explicit SkipTrackerThroughPortals(std::shared_ptr<const SkipLayout> layout);

  /// A skip between partitions is held until close() hides it in its portal; others go to the
  /// map.
  void save(const SkipKey& key, at::Tensor tensor) override;
  /// A skip between partitions comes from what open() took out of its portal; others from the
  /// map.
  at::Tensor load(const SkipKey& key) override;

  /// Before partition `partition` runs on `input`: takes out the tensors it pops from other
  /// partitions, each behind a phony forked from input[0]. Throws c10::Error if one of them has
  /// not been stashed.
  void open(Batch& input, size_t partition);

  /// After partition `partition` returned `output`: throws c10::Error "'name' must be stashed
  /// but have not" (or popped) for a name its layers declared but did not stash (or pop); hides
  /// every tensor stashed for another partition in its portal, joined into output[0].
  void close(Batch& output, size_t partition);

  /// At the fence of the partition that pops `key`: copies its hidden tensor from `prev`'s device
  /// to `next`'s, tied into batch[0]'s lane.
  void copy(Batch& batch, const c10::Stream& prev, const c10::Stream& next, const SkipKey& key);

  const std::map<SkipKey, c10::intrusive_ptr<Portal>>& portals() const { return portals_; }
  const SkipLayout& layout() const { return *layout_; }

 private:
  std::shared_ptr<const SkipLayout> layout_;
  std::map<SkipKey, c10::intrusive_ptr<Portal>> portals_;
  // The running partition's skips to and from other partitions, and every key it saved and
  // loaded; reset by open().
  std::map<SkipKey, at::Tensor> outgoing_;
  std::map<SkipKey, at::Tensor> incoming_;
  std::set<SkipKey> saved_;
  std::set<SkipKey> loaded_;
};

}  // namespace skip
}  // namespace gpipe

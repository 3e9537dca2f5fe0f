// Micro-batches: a Batch is one tensor (atomic) or a list of tensors, as a partition takes and
// returns them; scatter splits a mini-batch along dim 0 and gather concatenates it back.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>
// After sequential.h: LibTorch 1.13's any_value.h does not compile alone.
#include <torch/nn/modules/container/any_value.h>

#include <functional>
#include <string>
#include <vector>

namespace gpipe {

/// One tensor or a list of tensors, the value that flows between partitions. A partition's first
/// layer takes a `torch::Tensor` for an atomic batch and a `std::vector<torch::Tensor>` otherwise;
/// its last layer returns either.
///
/// Example:
///   gpipe::Batch batch(std::vector<torch::Tensor>{x, mask});
///   batch[0] = batch[0] * 2;                     // in-place update of one tensor
///   gpipe::Batch output = batch.call(partition);  // partition->forward(std::vector{x, mask})
class Batch {
 public:
  /// An atomic batch of one tensor.
  /*implicit*/ Batch(at::Tensor tensor);
  /// A batch of a list of tensors (possibly of one).
  /*implicit*/ Batch(std::vector<at::Tensor> tensors);

  bool atomic() const { return atomic_; }
  size_t size() const { return values_.size(); }

  /// The tensor of an atomic batch. Throws c10::TypeError for a list.
  const at::Tensor& tensor() const;
  /// Every tensor, for an atomic batch the one.
  const std::vector<at::Tensor>& tensors() const { return values_; }

  /// The tensor at `index`. Throws c10::IndexError out of range (an atomic batch has only 0).
  at::Tensor& operator[](size_t index);
  const at::Tensor& operator[](size_t index) const;

  /// Replaces every tensor at once, keeping atomicity: an atomic batch takes exactly one.
  void set_tensors(std::vector<at::Tensor> tensors);

  std::vector<at::Tensor>::const_iterator begin() const { return values_.begin(); }
  std::vector<at::Tensor>::const_iterator end() const { return values_.end(); }

  /// Runs the layers of `sequential` on this batch and wraps what the last one returns.
  /// Throws c10::TypeError if that is neither a Tensor nor a std::vector<Tensor>; `what` names the
  /// caller in that message (e.g. "partition 2").
  Batch call(torch::nn::Sequential& sequential, const std::string& what = "the module") const;

  /// Wraps a layer's return value; see call().
  static Batch from_value(torch::nn::AnyValue&& value, const std::string& what);

 private:
  std::vector<at::Tensor> values_;
  bool atomic_;
};

/// A function of one micro-batch, e.g. a partition's forward.
using BatchFunction = std::function<Batch(const Batch&)>;

/// Checks that `input` can be split into micro-batches: at least one tensor, each defined and at
/// least 1-dimensional, all with the same size along dim 0. Throws c10::ValueError naming the
/// offending tensor otherwise.
void check(const Batch& input);

/// Splits `input` along dim 0 into at most `chunks` micro-batches (fewer when the batch is
/// smaller, as torch::chunk does: batch 5 into 4 gives sizes 2, 2, 1).
/// REQUIRES: check(input) passes and chunks > 0.
std::vector<Batch> scatter(const Batch& input, int64_t chunks);

/// Concatenates micro-batch outputs along dim 0, position by position for lists. Throws
/// c10::TypeError if the outputs do not all have the same structure.
Batch gather(const std::vector<Batch>& outputs);

}  // namespace gpipe

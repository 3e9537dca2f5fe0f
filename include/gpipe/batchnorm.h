// DeferredBatchNorm: a BatchNorm whose running statistics are committed once per mini-batch,
// from all of its micro-batches, instead of once per micro-batch.
//
// In training each micro-batch is normalized with its own statistics, as a BatchNorm does on
// that micro-batch alone, but the running mean and variance are updated as if a BatchNorm had
// seen the whole mini-batch: the micro-batches' per-channel mean and sum of squared deviations
// are merged exactly (in double precision) and committed once the mini-batch's last micro-batch
// has been tracked, with the unbiased variance as torch::nn::BatchNorm uses. A recomputation
// under checkpointing (is_recomputing()) is not tracked again. In eval mode it normalizes with
// the running statistics, as a BatchNorm does.
//
// How many micro-batches make a mini-batch: options.chunks(), or the count given to
// begin_minibatch(); GPipe calls it before each training forward with the number of
// micro-batches the batch was actually split into (fewer than chunks for a small batch).
//
// Thread safety: the micro-batches of one mini-batch may be tracked on any thread but not
// concurrently (GPipe runs all micro-batches of a partition on its device's worker thread).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <vector>

namespace gpipe {

/// Options for DeferredBatchNorm.
///
/// Example:
///   gpipe::DeferredBatchNorm bn(gpipe::DeferredBatchNormOptions(64).momentum(0.01).chunks(8));
struct DeferredBatchNormOptions {
  /* implicit */ DeferredBatchNormOptions(int64_t num_features);

  /// The number of channels C of an input of shape (N, C, ...). Required.
  TORCH_ARG(int64_t, num_features);

  /// Added to the variance for numerical stability. Default: 1e-5.
  TORCH_ARG(double, eps) = 1e-5;

  /// The weight of a mini-batch's statistics in the running ones; unset for a cumulative
  /// average over all mini-batches. Default: 0.1.
  TORCH_ARG(c10::optional<double>, momentum) = 0.1;

  /// Whether the module has a learnable per-channel weight and bias. Default: true.
  TORCH_ARG(bool, affine) = true;

  /// The number of micro-batches of a mini-batch, unless begin_minibatch() says otherwise.
  /// Default: 1.
  TORCH_ARG(int64_t, chunks) = 1;
};

/// The DeferredBatchNorm module. See the file comment.
class DeferredBatchNormImpl : public torch::nn::Cloneable<DeferredBatchNormImpl> {
 public:
  /// Throws c10::ValueError if num_features or chunks is not positive, or eps is negative.
  explicit DeferredBatchNormImpl(DeferredBatchNormOptions options);

  /// Takes the options of `batch_norm` and shares its parameters and running statistics, so that
  /// the BatchNorm sees what this module commits. Throws c10::ValueError if `batch_norm` does not
  /// track running statistics, or for a chunks that is not positive.
  /// Works for torch::nn::BatchNorm{1,2,3}dImpl.
  template <size_t D, typename Derived>
  DeferredBatchNormImpl(const torch::nn::BatchNormImplBase<D, Derived>& batch_norm, int64_t chunks)
      : DeferredBatchNormImpl(batch_norm.options, chunks, batch_norm.weight, batch_norm.bias,
                              batch_norm.running_mean, batch_norm.running_var,
                              batch_norm.num_batches_tracked) {}

  /// Registers fresh parameters (ones and zeros) and running statistics (zeros and ones).
  void reset() override;

  /// Normalizes `input` of shape (N, C, ...). Throws c10::ValueError for fewer than 2
  /// dimensions or a channel count other than num_features.
  at::Tensor forward(const at::Tensor& input);

  /// Starts a mini-batch of `microbatches` micro-batches: statistics tracked but not committed
  /// are dropped, and the running statistics are committed after the `microbatches`-th one
  /// (afterwards again every options.chunks()). Throws c10::ValueError unless it is positive.
  void begin_minibatch(int64_t microbatches);

  /// Micro-batches tracked in the current mini-batch and not committed yet.
  int64_t tracked() const { return tracked_; }

  void pretty_print(std::ostream& stream) const override;

  DeferredBatchNormOptions options;
  at::Tensor weight;               ///< (C), if options.affine()
  at::Tensor bias;                 ///< (C), if options.affine()
  at::Tensor running_mean;         ///< (C)
  at::Tensor running_var;          ///< (C), unbiased
  at::Tensor num_batches_tracked;  ///< committed mini-batches (int64 scalar)

 private:
  DeferredBatchNormImpl(const torch::nn::BatchNormOptions& options, int64_t chunks,
                        at::Tensor weight, at::Tensor bias, at::Tensor running_mean,
                        at::Tensor running_var, at::Tensor num_batches_tracked);
  void register_state(at::Tensor weight, at::Tensor bias, at::Tensor running_mean,
                      at::Tensor running_var, at::Tensor num_batches_tracked);
  void track(const at::Tensor& input);
  void commit();
  void clear();

  int64_t expected_ = 1;  // micro-batches of the current mini-batch
  int64_t tracked_ = 0;
  int64_t count_ = 0;  // values per channel tracked so far
  at::Tensor mean_;    // (C) double: their mean
  at::Tensor m2_;      // (C) double: their sum of squared deviations from it
};

TORCH_MODULE(DeferredBatchNorm);

/// A Sequential like `module`, with the same names, in which every BatchNorm{1,2,3}d that tracks
/// running statistics is replaced by a DeferredBatchNorm sharing its parameters and running
/// statistics (the BatchNorm's options, and `chunks`). A DeferredBatchNorm with the same chunks
/// is kept; with other chunks, replaced. Other layers are kept as they are: a BatchNorm inside
/// another module cannot be replaced, because its owner calls it directly (LibTorch cannot nest
/// a plain Sequential either), which is warned about. Throws c10::ValueError unless chunks is
/// positive.
///
/// Example:
///   sequential = gpipe::convert_deferred_batch_norm(sequential, /*chunks=*/8);
torch::nn::Sequential convert_deferred_batch_norm(torch::nn::Sequential module, int64_t chunks = 1);

/// Every DeferredBatchNorm below `module` (not itself): those the engines tell where each
/// mini-batch begins (DeferredBatchNormImpl::begin_minibatch), as a loop of one's own would.
std::vector<std::shared_ptr<DeferredBatchNormImpl>> deferred_batch_norms(
    const torch::nn::Module& module);
}  // namespace gpipe

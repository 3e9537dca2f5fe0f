// GPipe: a torch::nn::Sequential split into partitions on devices and run as a pipeline of
// micro-batches, transparently to autograd.
//
// forward() splits the batch into `chunks` micro-batches, runs them through the partitions in
// GPipe's clock-cycle schedule (src/pipeline/pipeline.h), with one device thread per accelerator (the
// calling thread computes CPU partitions), and concatenates the outputs. backward() is autograd's
// own: the same loss.backward() as for the plain Sequential, giving the same gradients, with
// checkpointed micro-batches recomputed on the way.
//
// Thread safety: one forward at a time per GPipe (concurrent calls are serialized); backward
// follows autograd's rules.
#pragma once

#include "gpipe/checkpoint.h"
#include "gpipe/microbatch.h"
#include "gpipe/skip/layout.h"
#include "gpipe/trace.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

namespace gpipe {

class DeferredBatchNormImpl;
namespace detail {
class DeviceThread;  // src/detail/device_thread.h
}  // namespace detail

/// Options for GPipe.
///
/// Example:
///   gpipe::GPipe model(sequential, gpipe::GPipeOptions({2, 2}).chunks(8).checkpoint(
///                                      gpipe::CheckpointMode::kNever));
struct GPipeOptions {
  /* implicit */ GPipeOptions(std::vector<int64_t> balance);

  /// How many consecutive layers of the Sequential each partition takes; one entry per
  /// partition, each positive, summing to the number of layers. Required.
  TORCH_ARG(std::vector<int64_t>, balance);

  /// The device of each partition; extra devices are left unused.
  /// Default: every partition on CPU.
  TORCH_ARG(std::vector<c10::Device>, devices) = {};

  /// How many micro-batches to split each mini-batch into (fewer when the batch is smaller).
  /// Default: 1.
  TORCH_ARG(int64_t, chunks) = 1;

  /// Which micro-batches recompute their activations in backward instead of keeping them.
  /// Only in training mode with grad enabled. Default: CheckpointMode::kExceptLast.
  TORCH_ARG(CheckpointMode, checkpoint) = CheckpointMode::kExceptLast;

  /// Whether to replace every BatchNorm{1,2,3}d layer of the Sequential by a DeferredBatchNorm
  /// (batchnorm.h) sharing its parameters and running statistics, so that those are updated
  /// once per mini-batch from all its micro-batches, as without a pipeline.
  /// Default: false.
  TORCH_ARG(bool, deferred_batch_norm) = false;

  /// Records each partition's forward, recomputation and backward of each micro-batch (trace.h),
  /// partition j on worker row j, one step per training forward; a backward only where its input
  /// takes a gradient (not micro-batch 0 of partition 0 for an input that needs none; see
  /// src/detail/backward_span.h). Null for none. Default: null.
  TORCH_ARG(std::shared_ptr<trace::Tracer>, tracer) = nullptr;
};

/// The GPipe module. See the file comment.
///
/// Example:
///   torch::nn::Sequential sequential(torch::nn::Linear(8, 8), torch::nn::ReLU(),
///                                    torch::nn::Linear(8, 8), torch::nn::ReLU());
///   gpipe::GPipe model(sequential, gpipe::GPipeOptions({2, 2}).chunks(4));
///   torch::Tensor output = model->forward(torch::randn({64, 8}));
///   output.sum().backward();
class GPipeImpl : public torch::nn::Module {
 public:
  /// Splits `module` by `options.balance()` and moves partition j to `options.devices()[j]`.
  /// Throws c10::ValueError for a bad balance, chunk count, checkpoint mode, or a module whose
  /// children or parameters repeat; c10::IndexError for too few devices; c10::TypeError when
  /// the stashes and pops of its skippable layers do not pair up (skip::verify_skippables).
  GPipeImpl(torch::nn::Sequential module, GPipeOptions options);
  ~GPipeImpl() override;

  /// Runs the pipeline on a Tensor or a std::vector<Tensor>, and returns what the last
  /// partition returned as `ReturnType` (Tensor, std::vector<Tensor> or Batch).
  /// Throws c10::ValueError for an input that cannot be split (see microbatch.h check()) or is
  /// not on the first partition's device, and c10::TypeError when the output is not ReturnType.
  template <typename ReturnType = at::Tensor, typename InputType>
  ReturnType forward(InputType&& input) {
    Batch output = run(Batch(std::forward<InputType>(input)));
    if constexpr (std::is_same_v<ReturnType, Batch>) {
      return output;
    } else if constexpr (std::is_same_v<ReturnType, at::Tensor>) {
      TORCH_CHECK_TYPE(output.atomic(), "the pipeline returned a list of ", output.size(),
                       " tensors, but a Tensor was asked for: call forward<std::vector<Tensor>>()");
      return output.tensor();
    } else {
      static_assert(std::is_same_v<ReturnType, std::vector<at::Tensor>>,
                    "GPipe::forward returns a Tensor, a std::vector<Tensor> or a gpipe::Batch");
      TORCH_CHECK_TYPE(!output.atomic(),
                       "the pipeline returned a Tensor, but a std::vector<Tensor> was asked for");
      return output.tensors();
    }
  }

  /// The untyped forward: runs the pipeline on `input`.
  Batch run(const Batch& input);

  const GPipeOptions& options() const { return options_; }
  const std::vector<int64_t>& balance() const { return options_.balance(); }
  int64_t chunks() const { return options_.chunks(); }
  CheckpointMode checkpoint() const { return options_.checkpoint(); }
  /// The partitions, each a Sequential of consecutive layers keeping their original names.
  const std::vector<torch::nn::Sequential>& partitions() const { return partitions_; }
  /// The device of each partition.
  const std::vector<c10::Device>& devices() const { return devices_; }
  /// Where each skip connection (skip/skippable.h) starts and ends.
  const skip::SkipLayout& skip_layout() const { return *skip_layout_; }

  /// Number of layers, as in the Sequential that was split.
  size_t size() const { return layers_.size(); }
  /// Layer `index` of the Sequential that was split. Throws c10::IndexError out of range.
  std::shared_ptr<torch::nn::Module> ptr(size_t index) const;
  std::shared_ptr<torch::nn::Module> operator[](size_t index) const { return ptr(index); }
  template <typename ModuleType>
  std::shared_ptr<ModuleType> ptr(size_t index) const {
    return std::dynamic_pointer_cast<ModuleType>(ptr(index));
  }
  std::vector<std::shared_ptr<torch::nn::Module>>::const_iterator begin() const {
    return layers_.begin();
  }
  std::vector<std::shared_ptr<torch::nn::Module>>::const_iterator end() const {
    return layers_.end();
  }

  /// Refused with c10::TypeError: GPipe places the partitions itself.
  void to(c10::Device device, c10::ScalarType dtype, bool non_blocking = false) override;
  void to(c10::Device device, bool non_blocking = false) override;
  /// Casting every partition's parameters and buffers is allowed.
  void to(c10::ScalarType dtype, bool non_blocking = false) override;

  void pretty_print(std::ostream& stream) const override;

 private:
  const std::vector<c10::Stream>& copy_streams_for(size_t partition, size_t microbatches);

  GPipeOptions options_;
  std::vector<torch::nn::Sequential> partitions_;
  std::vector<c10::Device> devices_;
  std::vector<std::shared_ptr<torch::nn::Module>> layers_;
  std::vector<std::unique_ptr<detail::DeviceThread>> device_threads_;  // one per distinct device
  std::vector<detail::DeviceThread*>
      partition_threads_;  // the device thread of each partition (null: CPU)

  std::mutex forward_mutex_;
  std::vector<std::vector<c10::Stream>> copy_streams_;  // [partition][micro-batch]; guarded by it
  // Where the skip connections of the partitions start and end.
  std::shared_ptr<const skip::SkipLayout> skip_layout_;
  // The DeferredBatchNorms of the partitions, told each training forward's micro-batch count.
  std::vector<std::shared_ptr<DeferredBatchNormImpl>> deferred_batch_norms_;
  int64_t steps_ = 0;  // training forwards so far, to name steps in traces
};

TORCH_MODULE(GPipe);

}  // namespace gpipe

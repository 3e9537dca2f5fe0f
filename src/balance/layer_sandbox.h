// A layer ready to be profiled alone, and the helpers the profilers share (balance/profile.h,
// plan.h): a copy of the layer in training mode, or the layer itself where it cannot be cloned,
// restored afterwards.
#pragma once

#include "balance/module_state_guard.h"
#include "gpipe/microbatch.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpipe {
namespace balance {

// One layer, ready to be profiled on `device` in training mode: a clone, or the layer itself
// when it cannot be cloned, restored (values, gradients, modes) when the sandbox goes.
class LayerSandbox {
 public:
  LayerSandbox(size_t index, const std::string& name, const torch::nn::AnyModule& layer,
               c10::Device device);

  /// A Sequential of the one layer.
  torch::nn::Sequential& sequential() { return sequential_; }

 private:
  torch::nn::Sequential sequential_;
  std::optional<ModuleStateGuard> in_place_;  // set when profiled in place
};

/// Cuts the batch from the graph that made it, keeping which tensors require grad.
void detach(Batch& batch);

/// A copy of `sample` on `device`, cut from its graph, keeping which tensors require grad.
Batch to_device(const Batch& sample, c10::Device device);

/// Throws c10::ValueError if a parameter of `module` has a gradient, which profiling would
/// accumulate into.
void check_no_gradients(torch::nn::Sequential& module);

/// Waits for `device`'s current stream (nothing on the CPU).
void synchronize(c10::Device device);

/// Where the memory of a profile of `sample` is measured: its CUDA device (the caching
/// allocator), else the CPU, whose tracking allocator this installs if it was not.
c10::Device memory_profiling_device(const Batch& sample);

/// The bytes of `module`'s parameters, each storage once.
int64_t parameter_bytes(torch::nn::Sequential& module);

/// Bytes of the storages behind `tensors`, each storage once (views of one buffer count it
/// once, whole); undefined tensors count nothing.
int64_t storage_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace balance
}  // namespace gpipe

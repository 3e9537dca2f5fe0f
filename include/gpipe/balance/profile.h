// Per-layer profilers for automatic balancing: the time of each layer's forward and backward,
// and the memory each layer needs (activations kept for backward plus parameters).
//
// Every layer is profiled on a copy (Module::clone): the model keeps its devices, train/eval
// modes, parameter and buffer values, and its (undefined) gradients. A layer that cannot be
// cloned (it does not derive from torch::nn::Cloneable) is profiled in place and restored
// afterwards; it must then already be on the profiling device.
//
// Thread safety: profile one model at a time, and do not use the model meanwhile. Memory
// profiling counts every CPU tensor allocation of the process, so other threads should not
// allocate CPU tensors while it runs.
#pragma once

#include "gpipe/microbatch.h"

#include <c10/core/Device.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <vector>

namespace gpipe {
namespace balance {

/// Options for profile_times() and balance_by_time().
///
/// Example:
///   gpipe::balance::BalanceByTimeOptions().timeout(0.5).repetitions(5)
struct BalanceByTimeOptions {
  /// Profiling passes over all layers repeat until this many seconds have elapsed.
  /// Default: 1.0.
  TORCH_ARG(double, timeout) = 1.0;

  /// The least number of passes, even past the timeout; each layer's cost is its median over all
  /// passes. timeout(0) makes this the exact number of passes. Default: 1.
  TORCH_ARG(int64_t, repetitions) = 1;

  /// Where each layer and the sample are copied to and timed (CUDA work is synchronized before
  /// each reading). Default: the device of the sample's first tensor.
  TORCH_ARG(c10::optional<c10::Device>, device) = c10::nullopt;
};

/// Options for profile_sizes() and balance_by_size().
///
/// Example:
///   gpipe::balance::BalanceBySizeOptions().chunks(8).param_scale(4.0)  // for Adam
struct BalanceBySizeOptions {
  /// The number of micro-batches the model will be trained with: activations are measured on
  /// the first micro-batch of the sample, which should be a whole mini-batch. Default: 1.
  TORCH_ARG(int64_t, chunks) = 1;

  /// How many copies of its parameters each layer needs in training: 2 for weights and
  /// gradients, 3 for SGD with momentum, 4 or 5 for Adam. Default: 2.0.
  TORCH_ARG(double, param_scale) = 2.0;
};

/// The time in nanoseconds of each layer's forward and backward on `sample` (as fed through the
/// previous layers), the median over the passes. Layers run in training mode with grad enabled.
///
/// Throws c10::ValueError if some parameter already has a gradient, for bad options, or for a
/// layer that cannot be cloned and is not on the profiling device.
std::vector<int64_t> profile_times(torch::nn::Sequential module, const Batch& sample,
                                   const BalanceByTimeOptions& options = {});

/// The memory in bytes each layer needs for one micro-batch in training: the bytes its forward
/// keeps allocated (output and tensors saved for backward), plus param_scale times the bytes of
/// its parameters.
///
/// Measured where the sample is (memory.h): on a CUDA device with its caching allocator (whose
/// sizes are rounded to its blocks, as torchgpipe measures), on the CPU with the tracking
/// allocator (installed if it was not); a sample on another device is profiled on a CPU copy.
/// Throws c10::ValueError for bad options, or for a layer that cannot be cloned and is not on
/// that device.
std::vector<int64_t> profile_sizes(torch::nn::Sequential module, const Batch& sample,
                                   const BalanceBySizeOptions& options = {});

}  // namespace balance
}  // namespace gpipe

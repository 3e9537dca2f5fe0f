// A module's state, put back as it was when the guard goes: what profiling a module in place
// (balance/layer_sandbox.h) or training it for a few steps (plan/calibration.h) changes.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <utility>
#include <vector>

namespace gpipe {
namespace balance {

class ModuleStateGuard {
 public:
  /// Saves the values of `module`'s parameters and buffers (a batch norm's running statistics)
  /// and the training mode of each of its modules.
  explicit ModuleStateGuard(std::shared_ptr<torch::nn::Module> module);
  /// Copies the values back, leaves every parameter without a gradient, and restores the modes.
  ~ModuleStateGuard();
  ModuleStateGuard(const ModuleStateGuard&) = delete;
  ModuleStateGuard& operator=(const ModuleStateGuard&) = delete;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;  // (tensor, its value before)
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;
};

}  // namespace balance
}  // namespace gpipe

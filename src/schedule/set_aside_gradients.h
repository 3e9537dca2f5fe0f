// Gradients accumulated before a step, set aside while the step's own are completed - tied
// copies summed across ranks, replicas averaged, a grad scaler's unscaling and overflow check -
// and added back after: each of those applies to one step's gradients, so that accumulating
// several steps before an optimizer step stays exact.
//
// Internal to the engines.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace gpipe {
namespace detail {

/// For its lifetime, the parameters' gradients hold only what the step adds.
class SetAsideGradients {
 public:
  /// Takes the defined gradients of `parameters` out (they become undefined).
  explicit SetAsideGradients(const std::vector<at::Tensor>& parameters);
  /// Adds them back to what the step left, as one more backward would have accumulated them.
  ~SetAsideGradients();
  SetAsideGradients(const SetAsideGradients&) = delete;
  SetAsideGradients& operator=(const SetAsideGradients&) = delete;

 private:
  std::vector<at::Tensor> parameters_;  // those with a gradient set aside
  std::vector<at::Tensor> aside_;
};

}  // namespace detail
}  // namespace gpipe

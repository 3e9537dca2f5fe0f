// Gradients of a model's output, to compare a pipelined model with the plain one: the output,
// the input's gradient and every parameter's gradient of sum(output * linspace(-1, 1)).
#pragma once

#include "test_util.h"

#include <functional>
#include <vector>

namespace gpipe {
namespace testing {

struct Gradients {
  torch::Tensor output;
  torch::Tensor input_grad;
  std::vector<torch::Tensor> parameter_grads;
};

// Runs `forward` on a copy of `input` that requires grad, then backward of the weighted sum of
// the output; collects the gradients of `module`'s parameters and clears them.
inline Gradients gradients_of(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                              torch::nn::Module& module, const torch::Tensor& input) {
  auto x = input.clone().requires_grad_(true);
  const torch::Tensor output = forward(x);
  const auto weight =
      torch::linspace(-1, 1, output.numel(), output.options()).reshape(output.sizes());
  (output * weight).sum().backward();
  Gradients result{output.detach(), x.grad(), {}};
  for (auto& parameter : module.parameters()) {
    result.parameter_grads.push_back(parameter.grad().clone());
    parameter.mutable_grad().reset();
  }
  return result;
}

// Output and every gradient equal within 1e-6 (relative) and 1e-9 (absolute), compared on the
// CPU: a pipeline's parameters, and so their gradients, may live on another device.
inline void expect_close(const Gradients& actual, const Gradients& expected) {
  const auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
    return torch::allclose(a.cpu(), b.cpu(), 1e-6, 1e-9);
  };
  EXPECT_TRUE(close(actual.output, expected.output));
  ASSERT_TRUE(actual.input_grad.defined());
  EXPECT_TRUE(close(actual.input_grad, expected.input_grad));
  ASSERT_EQ(actual.parameter_grads.size(), expected.parameter_grads.size());
  for (size_t k = 0; k < actual.parameter_grads.size(); ++k) {
    EXPECT_TRUE(close(actual.parameter_grads[k], expected.parameter_grads[k])) << "parameter " << k;
  }
}

}  // namespace testing
}  // namespace gpipe

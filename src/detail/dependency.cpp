#include "detail/dependency.h"

#include "detail/phony.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace gpipe {
namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Fork : torch::autograd::Function<Fork> {
  static variable_list forward(AutogradContext*, const at::Tensor& input) {
    return {input.detach(), get_phony(input.device(), /*requires_grad=*/false).detach()};
  }
  static variable_list backward(AutogradContext*, variable_list grad) {
    return {std::move(grad[0])};
  }
};

struct Join : torch::autograd::Function<Join> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& input, const at::Tensor&) {
    return input.detach();
  }
  static variable_list backward(AutogradContext*, variable_list grad) {
    return {std::move(grad[0]), at::Tensor()};
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> fork(const at::Tensor& input) {
  if (torch::autograd::GradMode::is_enabled() && input.requires_grad()) {
    auto outputs = Fork::apply(input);
    return {std::move(outputs[0]), std::move(outputs[1])};
  }
  return {input, get_phony(input.device(), /*requires_grad=*/false)};
}

at::Tensor join(const at::Tensor& input, const at::Tensor& phony) {
  if (torch::autograd::GradMode::is_enabled() && (input.requires_grad() || phony.requires_grad())) {
    return Join::apply(input, phony);
  }
  return input;
}

}  // namespace detail
}  // namespace gpipe

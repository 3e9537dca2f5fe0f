#include "balance/module_state_guard.h"

#include <torch/csrc/autograd/grad_mode.h>

namespace gpipe {
namespace balance {

ModuleStateGuard::ModuleStateGuard(std::shared_ptr<torch::nn::Module> module) {
  torch::NoGradGuard no_grad;
  const auto save = [&](const at::Tensor& tensor) {
    if (tensor.defined()) saved_.emplace_back(tensor, tensor.detach().clone());
  };
  for (const auto& tensor : module->parameters()) save(tensor);
  for (const auto& tensor : module->buffers()) save(tensor);
  for (const auto& child : module->modules()) modes_.emplace_back(child, child->is_training());
}

ModuleStateGuard::~ModuleStateGuard() {
  torch::NoGradGuard no_grad;
  for (auto& [tensor, value] : saved_) {
    tensor.copy_(value);
    if (tensor.grad().defined()) tensor.mutable_grad() = at::Tensor();
  }
  for (auto& [module, training] : modes_) module->train(training);  // parents before children
}

}  // namespace balance
}  // namespace gpipe

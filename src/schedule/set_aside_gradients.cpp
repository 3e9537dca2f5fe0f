#include "schedule/set_aside_gradients.h"

#include <c10/util/irange.h>

#include <utility>

namespace gpipe {
namespace detail {

SetAsideGradients::SetAsideGradients(const std::vector<at::Tensor>& parameters) {
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    parameters_.push_back(p);
    aside_.push_back(std::exchange(p.mutable_grad(), at::Tensor()));
  }
}

SetAsideGradients::~SetAsideGradients() {
  for (const auto k : c10::irange(parameters_.size())) {
    at::Tensor& grad = parameters_[k].mutable_grad();
    grad = grad.defined() ? aside_[k].add_(grad) : std::move(aside_[k]);
  }
}

}  // namespace detail
}  // namespace gpipe

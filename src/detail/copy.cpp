#include "detail/copy.h"

#include "detail/differentiable.h"
#include "detail/stream.h"

#include <torch/csrc/autograd/custom_function.h>

namespace gpipe {
namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Copies `tensors` to `to`'s device with both streams current; see copy.h.
variable_list copy_between(const variable_list& tensors, const c10::Stream& from,
                           const c10::Stream& to) {
  const c10::Stream to_current = current_stream(to.device());
  UseStream use_from(from);
  UseStream use_to(to);
  variable_list copied;
  copied.reserve(tensors.size());
  for (const auto& x : tensors) {
    if (!x.defined()) {
      copied.emplace_back();
      continue;
    }
    at::Tensor y = x.to(to.device());
    record_stream(x, from);        // `from` is not where `x` was allocated.
    record_stream(y, to_current);  // `y` may be used on the current stream of its device.
    copied.push_back(std::move(y));
  }
  return copied;
}

struct Copy : torch::autograd::Function<Copy> {
  static variable_list forward(AutogradContext* ctx, c10::Stream prev, c10::Stream next,
                               at::TensorList input) {
    ctx->saved_data["prev"] = prev;
    ctx->saved_data["next"] = next;
    variable_list output = copy_between(input.vec(), prev, next);
    mark_non_differentiable(ctx, output);
    return output;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    variable_list grad_input{at::Tensor(), at::Tensor()};  // the streams
    for (auto& grad : copy_between(grad_output, ctx->saved_data["next"].toStream(),
                                   ctx->saved_data["prev"].toStream())) {
      grad_input.push_back(std::move(grad));
    }
    return grad_input;
  }
};

struct Wait : torch::autograd::Function<Wait> {
  static variable_list forward(AutogradContext* ctx, c10::Stream prev, c10::Stream next,
                               at::TensorList input) {
    ctx->saved_data["prev"] = prev;
    ctx->saved_data["next"] = next;
    wait_stream(next, prev);
    variable_list output;
    output.reserve(input.size());
    for (const auto& x : input) output.push_back(x.detach());
    mark_non_differentiable(ctx, output);
    return output;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_input) {
    wait_stream(ctx->saved_data["prev"].toStream(), ctx->saved_data["next"].toStream());
    grad_input.insert(grad_input.begin(), 2, at::Tensor());  // the streams
    return grad_input;
  }
};

std::vector<at::Tensor> detach_non_differentiable(std::vector<at::Tensor> tensors) {
  for (auto& x : tensors) {
    if (x.defined() && !differentiable(x)) x = x.detach();
  }
  return tensors;
}

}  // namespace

std::vector<at::Tensor> copy(const std::vector<at::Tensor>& input, const c10::Stream& prev,
                             const c10::Stream& next) {
  return detach_non_differentiable(Copy::apply(prev, next, at::TensorList(input)));
}

std::vector<at::Tensor> wait(const std::vector<at::Tensor>& input, const c10::Stream& prev,
                             const c10::Stream& next) {
  return detach_non_differentiable(Wait::apply(prev, next, at::TensorList(input)));
}

}  // namespace detail
}  // namespace gpipe

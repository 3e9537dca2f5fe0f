#include "gpipe/skip/portal.h"

#include "detail/copy.h"
#include "detail/phony.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

namespace gpipe {
namespace skip {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

c10::intrusive_ptr<Portal> portal_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<Portal>(ctx->saved_data["portal"].toCapsule());
}

// Hides the tensor: the output is a phony; the gradient comes from the portal.
struct PortalBlue : torch::autograd::Function<PortalBlue> {
  static at::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<Portal> portal,
                            const at::Tensor& tensor) {
    ctx->saved_data["portal"] = c10::IValue::make_capsule(std::move(portal));
    return gpipe::detail::get_phony(tensor.device(), /*requires_grad=*/false).detach();
  }
  static variable_list backward(AutogradContext* ctx, variable_list /*grad_phony*/) {
    // No gradient when the popped tensor reached no loss (PortalOrange never ran).
    auto portal = portal_of(ctx);
    return {at::Tensor(), portal->has_grad() ? portal->use_grad() : at::Tensor()};
  }
};

// Takes the tensor out; its gradient goes into the portal, for PortalBlue.
struct PortalOrange : torch::autograd::Function<PortalOrange> {
  static at::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<Portal> portal,
                            const at::Tensor& /*phony*/) {
    at::Tensor tensor = portal->use_tensor();
    ctx->saved_data["portal"] = c10::IValue::make_capsule(std::move(portal));
    TORCH_INTERNAL_ASSERT(tensor.defined());
    at::Tensor output = tensor.detach();
    if (!output.is_floating_point() && !output.is_complex()) {
      ctx->mark_non_differentiable({output});
    }
    return output;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    portal_of(ctx)->put_grad(std::move(grad[0]));
    return {at::Tensor(), at::Tensor()};
  }
};

// Copies the hidden tensor to the next device, and its gradient back.
struct PortalCopy : torch::autograd::Function<PortalCopy> {
  static at::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<Portal> portal,
                            c10::Stream prev, c10::Stream next, const at::Tensor& /*phony*/) {
    TORCH_INTERNAL_ASSERT(portal->tensor().defined());
    portal->replace_tensor(gpipe::detail::copy({portal->tensor()}, prev, next)[0]);
    ctx->saved_data["portal"] = c10::IValue::make_capsule(std::move(portal));
    ctx->saved_data["prev"] = prev;
    ctx->saved_data["next"] = next;
    return gpipe::detail::get_phony(next.device(), /*requires_grad=*/false).detach();
  }
  static variable_list backward(AutogradContext* ctx, variable_list /*grad_phony*/) {
    auto portal = portal_of(ctx);
    if (portal->has_grad()) {
      portal->put_grad(gpipe::detail::copy({portal->use_grad()}, ctx->saved_data["next"].toStream(),
                                           ctx->saved_data["prev"].toStream())[0]);
    }
    return variable_list(4);
  }
};

}  // namespace

Portal::Portal(at::Tensor tensor, int64_t tensor_life) {
  put_tensor(std::move(tensor), tensor_life);
}

at::Tensor Portal::blue() {
  at::Tensor tensor = use_tensor();
  if (!tensor.defined()) return gpipe::detail::get_phony(c10::kCPU, /*requires_grad=*/false);
  return PortalBlue::apply(c10::intrusive_ptr<Portal>::reclaim_copy(this), tensor);
}

at::Tensor Portal::orange(const at::Tensor& phony) {
  check_tensor_life();
  if (!tensor_.defined()) return use_tensor();
  return PortalOrange::apply(c10::intrusive_ptr<Portal>::reclaim_copy(this), phony);
}

at::Tensor Portal::copy(const c10::Stream& prev, const c10::Stream& next, const at::Tensor& phony) {
  if (!tensor_.defined()) return gpipe::detail::get_phony(c10::kCPU, /*requires_grad=*/false);
  return PortalCopy::apply(c10::intrusive_ptr<Portal>::reclaim_copy(this), prev, next, phony);
}

void Portal::check_tensor_life() const {
  TORCH_CHECK(tensor_life_ > 0, "tensor in portal has been removed");
}

void Portal::put_tensor(at::Tensor tensor, int64_t tensor_life) {
  tensor_life_ = tensor_life;
  tensor_ = tensor_life > 0 ? std::move(tensor) : at::Tensor();
}

at::Tensor Portal::use_tensor() {
  check_tensor_life();
  at::Tensor tensor = tensor_;
  if (--tensor_life_ <= 0) tensor_.reset();
  return tensor;
}

void Portal::put_grad(at::Tensor grad) { grad_ = std::move(grad); }

at::Tensor Portal::use_grad() {
  TORCH_CHECK(grad_.defined(), "grad in portal has been removed or never set");
  at::Tensor grad = std::move(grad_);
  grad_.reset();
  return grad;
}

}  // namespace skip
}  // namespace gpipe

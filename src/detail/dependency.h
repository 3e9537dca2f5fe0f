// Fork and join: arbitrary ordering edges between autograd lanes, made of phonies.
//
//   a = ...            a', phony = fork(a)      b' = join(b, phony)
//
// In backward, the gradient of b' reaches the phony before fork's node may run, so everything
// upstream of `a` is differentiated after everything downstream of `b'`. The pipeline uses this
// to make micro-batch i-1's backward wait for micro-batch i's, as GPipe's schedule needs.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace gpipe {
namespace detail {

/// Branches off a phony from `input`'s lane. Returns (input', phony); input' carries the same
/// data and gradient as `input`. Without grad mode, or when `input` needs no grad, returns
/// (input, a phony that needs no grad) and records nothing.
std::pair<at::Tensor, at::Tensor> fork(const at::Tensor& input);

/// Merges `phony`'s lane into `input`'s. Returns input', which carries `input`'s data and
/// gradient. Records nothing when neither side needs grad or grad mode is off.
at::Tensor join(const at::Tensor& input, const at::Tensor& phony);

}  // namespace detail
}  // namespace gpipe

// One all-reduce of many tensors over a Gloo group: flattened into one float64 buffer, reduced,
// and copied back. The sum of two float32 (or bfloat16) values is exact in float64, so between two
// ranks the result rounds once, as adding them on one rank would.
//
// Internal to the distributed engine.
#pragma once

#include "gpipe/distributed/rendezvous.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

namespace gpipe {
namespace detail {

/// Reduces `tensors` with `op` over `group`, in place, then divides them by `divisor`. Throws
/// c10::Error naming `what` (e.g. "the all-reduce among replicas 0, 2") if it fails.
/// REQUIRES: every tensor defined; the same shapes in the same order on every member.
void all_reduce(distributed::Backend& group, const std::vector<at::Tensor>& tensors,
                c10d::ReduceOp::RedOpType op, double divisor, const std::string& what);

}  // namespace detail
}  // namespace gpipe

#include "distributed/all_reduce.h"

#include "detail/message_of.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>

#include <exception>

namespace gpipe {
namespace detail {

void all_reduce(distributed::Backend& group, const std::vector<at::Tensor>& tensors,
                c10d::ReduceOp::RedOpType op, double divisor, const std::string& what) {
  if (tensors.empty()) return;
  std::vector<at::Tensor> parts;
  parts.reserve(tensors.size());
  for (const auto& t : tensors) {
    TORCH_INTERNAL_ASSERT(t.defined(), what, " needs defined tensors");
    parts.push_back(t.detach().reshape({-1}).to(at::kDouble).cpu());
  }
  std::vector<at::Tensor> flat{at::cat(parts)};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  try {
    group.allreduce(flat, options)->wait();
  } catch (const std::exception& error) {
    TORCH_CHECK(false, what, " failed: ", message_of(error));
  }
  if (divisor != 1) flat[0].div_(divisor);
  int64_t at = 0;
  for (const auto& t : tensors) {
    const int64_t n = t.numel();
    t.detach().copy_(flat[0].narrow(0, at, n).view(t.sizes()));
    at += n;
  }
}

}  // namespace detail
}  // namespace gpipe

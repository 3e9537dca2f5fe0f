// c10d::ProcessGroupNCCL, made where NCCL's c10d header is seen (nccl_backend.h).
#include "distributed/nccl_backend.h"

#include <c10/util/Exception.h>

#if GPIPE_WITH_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace gpipe {
namespace distributed {

#if GPIPE_WITH_NCCL

bool libtorch_has_nccl() { return true; }

c10::intrusive_ptr<Backend> new_process_group_nccl(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int64_t rank, int64_t world_size,
                                                   std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank),
                                                     static_cast<int>(world_size), options);
}

#else

bool libtorch_has_nccl() { return false; }

c10::intrusive_ptr<Backend> new_process_group_nccl(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int64_t rank, int64_t world_size,
                                                   std::chrono::milliseconds timeout) {
  TORCH_INTERNAL_ASSERT(false, "this gpipe has no NCCL: new_nccl_backend checks that first");
}

#endif

}  // namespace distributed
}  // namespace gpipe

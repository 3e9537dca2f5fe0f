// NCCL backends for CUDA tensors; without NCCL in LibTorch (Debian's 1.13, CPU) a clear error.
#include "gpipe/distributed/rendezvous.h"

#include "detail/message_of.h"

#include <c10/util/Exception.h>

#if GPIPE_WITH_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace gpipe {
namespace distributed {

#if GPIPE_WITH_NCCL

bool nccl_available() { return true; }

c10::intrusive_ptr<Backend> new_nccl_backend(const ProcessGroup& world, const std::string& name,
                                             std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::PrefixStore>("gpipe/nccl/" + name, world.store);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  try {
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(
        store, static_cast<int>(world.rank()), static_cast<int>(world.world_size()), options);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "rank ", world.rank(), " could not make the NCCL backend '", name, "' of ",
                world.world_size(), " ranks: ", detail::message_of(error));
  }
}

#else

bool nccl_available() { return false; }

c10::intrusive_ptr<Backend> new_nccl_backend(const ProcessGroup& world, const std::string& name,
                                             std::chrono::milliseconds timeout) {
  TORCH_CHECK(false, "rank ", world.rank(), " cannot move CUDA tensors: this gpipe was built ",
              "with a LibTorch without CUDA and NCCL (build against the torch wheel's)");
}

#endif

}  // namespace distributed
}  // namespace gpipe

// The NCCL process group behind nccl_available() and new_nccl_backend() (rendezvous.h). Only
// nccl_backend.cpp sees NCCL's c10d header: CMakeLists.txt gives that source alone
// GPIPE_WITH_NCCL and nccl.h's directory, so that every other shares one precompiled header.
// Without NCCL in LibTorch (Debian's 1.13, CPU) there is none to make.
//
// Thread safety: any thread may call; each call makes a process group of its own.
//
// Internal to the distributed part.
#pragma once

#include "gpipe/distributed/rendezvous.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>

namespace gpipe {
namespace distributed {

/// True if this gpipe was built against a LibTorch with NCCL (the torch wheel's).
bool libtorch_has_nccl();

/// A c10d::ProcessGroupNCCL of `world_size` ranks over `store`, this one `rank`, whose
/// operations NCCL's watchdog gives up on after `timeout`. REQUIRES: libtorch_has_nccl().
c10::intrusive_ptr<Backend> new_process_group_nccl(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int64_t rank, int64_t world_size,
                                                   std::chrono::milliseconds timeout);

}  // namespace distributed
}  // namespace gpipe

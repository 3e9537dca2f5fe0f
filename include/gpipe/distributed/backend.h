// Backend: what a c10d process group's implementation (Gloo, NCCL) is called in this LibTorch.
//
// LibTorch 2.x splits a process group into
// c10d::ProcessGroup (the front, dispatching by device) and a c10d::Backend per device type
// (ProcessGroupGloo, ProcessGroupNCCL); in LibTorch 1.13 the implementations are process groups
// themselves. gpipe talks to the implementations directly, as c10d::Backend in 2.x and
// c10d::ProcessGroup in 1.13: send, recv and Work are alike in both.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace gpipe {
namespace distributed {

#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

}  // namespace distributed
}  // namespace gpipe

// Rendezvous: connects the processes of one job, as torch.distributed's env:// init does.
//
// Rank 0 serves a c10d::TCPStore on MASTER_PORT (under torchrun, its agent already does:
// environment.h); every rank connects to it at MASTER_ADDR and waits until all WORLD_SIZE ranks
// have joined. The keys of each attempt of a group torchrun restarts stay apart. Over that store
// the ranks build a c10d::ProcessGroupGloo (full mesh of TCP connections) for CPU tensors. Gloo
// binds to the interface named by GLOO_SOCKET_IFNAME if set, to loopback when MASTER_ADDR is a
// loopback address, and otherwise to the address this machine's hostname resolves to. CUDA tensors
// travel over NCCL backends made on demand over the same store (new_nccl_backend).
//
// Backend: what a c10d process group's implementation (Gloo, NCCL) is called in this LibTorch.
// LibTorch 2.x splits a process group into c10d::ProcessGroup (the front, dispatching by device)
// and a c10d::Backend per device type (ProcessGroupGloo, ProcessGroupNCCL); in LibTorch 1.13 the
// implementations are process groups themselves. gpipe talks to the implementations directly,
// as c10d::Backend in 2.x and c10d::ProcessGroup in 1.13: send, recv and Work are alike in both.
//
// Thread safety: the store is safe to use from several threads (TCPStore serializes its calls);
// the process group's calls are issued by one thread at a time (the pipeline's worker).
#pragma once

#include "gpipe/distributed/environment.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpipe {
namespace distributed {

/// A process group's implementation (see the file comment).
#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

/// The connected processes of one job.
struct ProcessGroup {
  Environment environment;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<Backend> group;  ///< Gloo, for CPU tensors
  /// How many transports (c10d_transport.h) have been made over this group, to give each its
  /// own keys in the store and its own tags.
  std::shared_ptr<std::atomic<int64_t>> transports = std::make_shared<std::atomic<int64_t>>(0);

  int64_t rank() const { return environment.rank; }
  int64_t world_size() const { return environment.world_size; }
};

/// Connects to the other ranks of `env` (rank 0 or torchrun's agent serves the store), waiting at
/// most `timeout` for all of them; the process group's operations time out after `timeout` as
/// well. The result's `store` holds this attempt's keys only (under
/// "gpipe/<run id>/attempt_<restart count>/"). Throws c10::Error naming MASTER_ADDR:MASTER_PORT and
/// the ranks that did not join if they do not all join in time (rank 0 then stays up to a second
/// more, until the others have read that). Sets SIGPIPE to ignored unless the program handles it
/// (as Python does at startup), so that a peer that dies mid-send is an error naming it, not the
/// death of this process.
ProcessGroup rendezvous(const Environment& env, std::chrono::milliseconds timeout);

/// A Gloo process group among `ranks` of `world` (like torch.distributed.new_group), whose
/// rendezvous keys go under `name` in the world's store. Only the members call it, each with
/// the same ranks and name; a name is used once. Returns this rank's group, in which rank k is
/// ranks[k]. Throws c10::ValueError unless this rank is among `ranks`.
c10::intrusive_ptr<Backend> new_group(const ProcessGroup& world, const std::vector<int64_t>& ranks,
                                      const std::string& name, std::chrono::milliseconds timeout);

/// True if this gpipe was built with a LibTorch that has CUDA and NCCL (the `torch` wheel's).
bool nccl_available();

/// A NCCL backend among all ranks of `world`, for CUDA tensors on this rank's current CUDA
/// device, whose keys go under `name` in the world's store. Every rank calls it with the same
/// name, once per name; it talks to nobody until its first send or receive. NCCL matches the
/// messages between two ranks in the order they are posted (it has no tags), so each stream of
/// messages that must not mix with another needs a backend of its own. NCCL's own watchdog
/// gives up on an operation after `timeout`. Throws c10::Error unless nccl_available().
c10::intrusive_ptr<Backend> new_nccl_backend(const ProcessGroup& world, const std::string& name,
                                             std::chrono::milliseconds timeout);

}  // namespace distributed
}  // namespace gpipe

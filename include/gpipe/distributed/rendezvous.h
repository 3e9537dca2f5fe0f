// Rendezvous: connects the processes of one job, as torch.distributed's env:// init does.
//
// Rank 0 serves a c10d::TCPStore on MASTER_PORT; every rank connects to it at MASTER_ADDR and
// waits until all WORLD_SIZE ranks have joined. Over that store the ranks build a
// c10d::ProcessGroupGloo (full mesh of TCP connections) for CPU tensors. Gloo binds to the
// interface named by GLOO_SOCKET_IFNAME if set, to loopback when MASTER_ADDR is a loopback
// address, and otherwise to the address this machine's hostname resolves to.
//
// Thread safety: the store is safe to use from several threads (TCPStore serializes its calls);
// the process group's calls are issued by one thread at a time (the pipeline's worker).
#pragma once

#include "gpipe/distributed/environment.h"

// LibTorch's CMake configuration defines this where LibTorch has Gloo (Debian's does); the Gloo
// process group's header is empty without it.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpipe {
namespace distributed {

/// The connected processes of one job.
struct ProcessGroup {
  Environment environment;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  /// How many transports (c10d_transport.h) have been made over this group, to give each its
  /// own keys in the store.
  std::shared_ptr<std::atomic<int64_t>> transports = std::make_shared<std::atomic<int64_t>>(0);

  int64_t rank() const { return environment.rank; }
  int64_t world_size() const { return environment.world_size; }
};

/// Connects to the other ranks of `env` (rank 0 serves the store), waiting at most `timeout`
/// for all of them; the process group's operations time out after `timeout` as well. Throws
/// c10::Error naming MASTER_ADDR:MASTER_PORT if the ranks do not all join in time.
ProcessGroup rendezvous(const Environment& env, std::chrono::milliseconds timeout);

/// A Gloo process group among `ranks` of `world` (like torch.distributed.new_group), whose
/// rendezvous keys go under `name` in the world's store. Only the members call it, each with
/// the same ranks and name; a name is used once. Returns this rank's group, in which rank k is
/// ranks[k]. Throws c10::ValueError unless this rank is among `ranks`.
c10::intrusive_ptr<c10d::ProcessGroup> new_group(const ProcessGroup& world,
                                                 const std::vector<int64_t>& ranks,
                                                 const std::string& name,
                                                 std::chrono::milliseconds timeout);

}  // namespace distributed
}  // namespace gpipe

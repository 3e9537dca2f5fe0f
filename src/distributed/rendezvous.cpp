#include "gpipe/distributed/rendezvous.h"

#include "detail/message_of.h"
#include "distributed/nccl_backend.h"

// LibTorch's own build defines this where it has Gloo (Debian's and the wheel's do); the Gloo
// backend's header is empty without it.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <csignal>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <thread>

namespace gpipe {
namespace distributed {
namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const Environment& env) {
  if (const char* name = std::getenv("GLOO_SOCKET_IFNAME"); name != nullptr && *name != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(name);
  }
  if (is_loopback(env.master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// E.g. "8 s" or "2.5 s".
std::string seconds(std::chrono::milliseconds duration) {
  std::ostringstream out;
  out << static_cast<double>(duration.count()) / 1000 << " s";
  return out.str();
}

// Whether something listens at host:port by `deadline`, trying every 50 ms. The TCPStore's
// client retries past its own timeout (torch 2.x connects once more after a back-off, so a rank
// whose store server never comes waited up to twice the rendezvous timeout): ranks wait here
// instead, and connect once the server listens.
bool listening_by(const std::string& host, int64_t port,
                  std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(port);
  for (;;) {
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) == 0) {
      bool connected = false;
      for (addrinfo* a = found; a != nullptr && !connected; a = a->ai_next) {
        const int fd =
            socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          connected = true;
        } else if (errno == EINPROGRESS) {
          const auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
          pollfd waiting{fd, POLLOUT, 0};
          int error = 0;
          socklen_t size = sizeof(error);
          connected = poll(&waiting, 1,
                           static_cast<int>(std::clamp<int64_t>(left.count(), 1, 1000))) == 1 &&
                      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
        }
        close(fd);
      }
      freeaddrinfo(found);
      if (connected) return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Each rank says it joined; all wait until WORLD_SIZE have. At `deadline` rank 0 declares the
// rendezvous failed and stays until the others have read that (at most a second), so that
// every rank names the missing ones rather than the loss of rank 0's store; the others follow
// rank 0, or their own deadline a second later.
void wait_for_ranks(c10d::Store& store, const Environment& env,
                    std::chrono::steady_clock::time_point deadline, const std::string& where) {
  using Clock = std::chrono::steady_clock;
  const std::string joined = "rendezvous/joined";
  const std::string failed = "rendezvous/failed";
  const std::string read = "rendezvous/failure_read";
  // Counters only, so no call waits for a key; a call that fails lost the store's server.
  auto add = [&](const std::string& key, int64_t value) {
    try {
      return store.add(key, value);
    } catch (const std::exception& error) {
      TORCH_CHECK(false, where, ": lost ", env.store_server(), ", which serves it [",
                  detail::message_of(error), "]");
    }
  };
  add(joined + "/" + std::to_string(env.rank), 1);
  add(joined, 1);
  if (env.rank != 0) deadline += std::chrono::seconds(1);
  while (add(joined, 0) < env.world_size) {
    const bool rank0_gave_up = env.rank != 0 && add(failed, 0) > 0;
    if (Clock::now() < deadline && !rank0_gave_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    std::ostringstream missing;
    int64_t absent = 0;
    for (int64_t r = 0; r < env.world_size; ++r) {
      if (add(joined + "/" + std::to_string(r), 0) > 0) continue;
      missing << (absent++ ? ", " : "") << r;
    }
    if (env.rank == 0) {
      add(failed, 1);
      const auto linger = Clock::now() + std::chrono::seconds(1);
      while (add(read, 0) < env.world_size - absent - 1 && Clock::now() < linger) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } else {
      add(read, 1);
    }
    TORCH_CHECK(false, where, ": ", env.world_size - absent, " of ", env.world_size,
                " ranks joined (missing: ", missing.str(), ")");
  }
}

// Gloo writes to its sockets with plain writev, so a peer that dies mid-send would kill this
// process with SIGPIPE before it could name that peer. Python ignores SIGPIPE at startup, so
// torch.distributed never meets it; a C++ program does. A handler the program set stays.
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

ProcessGroup rendezvous(const Environment& env, std::chrono::milliseconds timeout) {
  ignore_sigpipe();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string address = env.master_addr + ":" + std::to_string(env.master_port);
  const std::string where = "rendezvous at " + address + " timed out after " + seconds(timeout);
  const bool serves = env.rank == 0 && !env.agent_store;
  ProcessGroup result;
  result.environment = env;
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = serves;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = false;  // counted below, to name the ranks that did not come
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    if (!serves && !listening_by(env.master_addr, env.master_port, deadline)) {
      throw std::runtime_error("nothing listens at " + address);
    }
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& error) {
    TORCH_CHECK(
        false,
        serves ? "rank 0 could not serve the rendezvous at " + address + " (is the port taken?)"
               : where + ": rank " + std::to_string(env.rank) + " could not reach " +
                     env.store_server() + ", which serves it",
        " [", detail::message_of(error), "]");
  }
  // A restarted group meets again in torchrun's store, which outlives its ranks: each attempt
  // keeps to keys of its own.
  result.store = c10::make_intrusive<c10d::PrefixStore>(
      "gpipe/" + env.run_id + "/attempt_" + std::to_string(env.restart_count), store);
  wait_for_ranks(*result.store, env, deadline, where);
  auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
  gloo->devices.push_back(gloo_device(env));
  try {
    result.group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        result.store, static_cast<int>(env.rank), static_cast<int>(env.world_size), gloo);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "rank ", env.rank, " could not connect the Gloo process group of ",
                env.world_size, " ranks (timeout ", timeout.count(), " ms; a rank that is gone, ",
                "or ", env.store_server(), ", which serves the store at ", address,
                "?): ", detail::message_of(error));
  }
  return result;
}

c10::intrusive_ptr<Backend> new_group(const ProcessGroup& world, const std::vector<int64_t>& ranks,
                                      const std::string& name, std::chrono::milliseconds timeout) {
  const auto it = std::find(ranks.begin(), ranks.end(), world.rank());
  TORCH_CHECK_VALUE(it != ranks.end(), "rank ", world.rank(), " is not among the ranks of group '",
                    name, "'");
  auto store = c10::make_intrusive<c10d::PrefixStore>("gpipe/group/" + name, world.store);
  auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
  gloo->devices.push_back(gloo_device(world.environment));
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(it - ranks.begin()),
                                                       static_cast<int>(ranks.size()), gloo);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "rank ", world.rank(), " could not connect group '", name, "' of ",
                ranks.size(), " ranks within ", timeout.count(),
                " ms: ", detail::message_of(error));
  }
}

bool nccl_available() { return libtorch_has_nccl(); }

c10::intrusive_ptr<Backend> new_nccl_backend(const ProcessGroup& world, const std::string& name,
                                             std::chrono::milliseconds timeout) {
  TORCH_CHECK(nccl_available(), "rank ", world.rank(), " cannot move CUDA tensors: this gpipe ",
              "was built with a LibTorch without CUDA and NCCL (build against the torch wheel's)");
  auto store = c10::make_intrusive<c10d::PrefixStore>("gpipe/nccl/" + name, world.store);
  try {
    return new_process_group_nccl(store, world.rank(), world.world_size(), timeout);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "rank ", world.rank(), " could not make the NCCL backend '", name, "' of ",
                world.world_size(), " ranks: ", detail::message_of(error));
  }
}

}  // namespace distributed
}  // namespace gpipe

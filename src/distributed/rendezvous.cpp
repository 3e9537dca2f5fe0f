#include "gpipe/distributed/rendezvous.h"

// LibTorch's own build defines this where it has Gloo (Debian's and the wheel's do); the Gloo
// backend's header is empty without it.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>

#include <cstdlib>
#include <exception>
#include <string>

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

}  // namespace

ProcessGroup rendezvous(const Environment& env, std::chrono::milliseconds timeout) {
  ProcessGroup result;
  result.environment = env;
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = env.rank == 0;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  try {
    result.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "rank ", env.rank, " could not join the rendezvous at ", env.master_addr,
                ":", env.master_port, " (", env.world_size, " ranks) within ", timeout.count(),
                " ms: ", error.what());
  }
  auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
  gloo->devices.push_back(gloo_device(env));
  try {
    result.group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        result.store, static_cast<int>(env.rank), static_cast<int>(env.world_size), gloo);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "rank ", env.rank, " could not connect the Gloo process group of ",
                env.world_size, " ranks (timeout ", timeout.count(), " ms; a rank that is gone, ",
                "or rank 0, which serves the store at ", env.master_addr, ":", env.master_port,
                "?): ", error.what());
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
                ranks.size(), " ranks within ", timeout.count(), " ms: ", error.what());
  }
}

}  // namespace distributed
}  // namespace gpipe

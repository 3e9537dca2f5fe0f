#include "gpipe/distributed/environment.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>
#include <optional>

namespace gpipe {
namespace distributed {
namespace {

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string required(const char* name) {
  auto value = variable(name);
  TORCH_CHECK_VALUE(value.has_value(), "environment variable ", name,
                    " is not set; run under torchrun or gpipe_launch, which set RANK, WORLD_SIZE, "
                    "LOCAL_RANK, MASTER_ADDR and MASTER_PORT");
  return *value;
}

int64_t integer(const char* name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  TORCH_CHECK_VALUE(!text.empty() && end != nullptr && *end == '\0' && errno == 0,
                    "environment variable ", name, " must be an integer, but is '", text, "'");
  return static_cast<int64_t>(value);
}

}  // namespace

std::string Environment::store_server() const {
  return agent_store ? "torchrun's agent" : "rank 0";
}

Environment read_environment() {
  Environment env;
  env.world_size = integer("WORLD_SIZE", required("WORLD_SIZE"));
  TORCH_CHECK_VALUE(env.world_size >= 1, "WORLD_SIZE must be at least 1, but is ", env.world_size);
  env.rank = integer("RANK", required("RANK"));
  TORCH_CHECK_VALUE(env.rank >= 0 && env.rank < env.world_size,
                    "RANK must be in [0, WORLD_SIZE = ", env.world_size, "), but is ", env.rank);
  const auto local_world_size = variable("LOCAL_WORLD_SIZE");
  env.local_world_size =
      local_world_size ? integer("LOCAL_WORLD_SIZE", *local_world_size) : env.world_size;
  TORCH_CHECK_VALUE(env.local_world_size >= 1 && env.local_world_size <= env.world_size,
                    "LOCAL_WORLD_SIZE must be in [1, WORLD_SIZE = ", env.world_size, "], but is ",
                    env.local_world_size);
  const auto local = variable("LOCAL_RANK");
  // torchrun numbers the ranks of a machine consecutively.
  env.local_rank = local ? integer("LOCAL_RANK", *local) : env.rank % env.local_world_size;
  TORCH_CHECK_VALUE(env.local_rank >= 0 && env.local_rank < env.local_world_size,
                    "LOCAL_RANK must be in [0, LOCAL_WORLD_SIZE = ", env.local_world_size,
                    "), but is ", env.local_rank);
  const auto group_rank = variable("GROUP_RANK");
  env.group_rank = group_rank ? integer("GROUP_RANK", *group_rank) : 0;
  TORCH_CHECK_VALUE(env.group_rank >= 0, "GROUP_RANK must be at least 0, but is ", env.group_rank);
  env.master_addr = required("MASTER_ADDR");
  TORCH_CHECK_VALUE(!env.master_addr.empty(), "environment variable MASTER_ADDR is empty");
  env.master_port = integer("MASTER_PORT", required("MASTER_PORT"));
  TORCH_CHECK_VALUE(env.master_port >= 1 && env.master_port <= 65535,
                    "MASTER_PORT must be in [1, 65535], but is ", env.master_port);
  // torchrun writes Python's str(bool).
  const std::string agent_store = variable("TORCHELASTIC_USE_AGENT_STORE").value_or("False");
  TORCH_CHECK_VALUE(agent_store == "True" || agent_store == "False",
                    "TORCHELASTIC_USE_AGENT_STORE must be True or False, but is '", agent_store,
                    "'");
  env.agent_store = agent_store == "True";
  env.run_id = variable("TORCHELASTIC_RUN_ID").value_or("");
  const auto restarts = variable("TORCHELASTIC_RESTART_COUNT");
  env.restart_count = restarts ? integer("TORCHELASTIC_RESTART_COUNT", *restarts) : 0;
  TORCH_CHECK_VALUE(env.restart_count >= 0,
                    "TORCHELASTIC_RESTART_COUNT must be at least 0, but is ", env.restart_count);
  return env;
}

}  // namespace distributed
}  // namespace gpipe

// Environment: who this process is in a multi-process pipeline, read from the variables torchrun
// sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); gpipe_launch sets the same.
//
// Thread safety: read_environment() reads the process environment (getenv); call it before
// starting threads that change the environment.
#pragma once

#include <cstdint>
#include <string>

namespace gpipe {
namespace distributed {

/// This process's place among the processes of one job.
struct Environment {
  int64_t rank = 0;         ///< RANK: 0 <= rank < world_size
  int64_t world_size = 1;   ///< WORLD_SIZE: the number of processes
  int64_t local_rank = 0;   ///< LOCAL_RANK: the rank among the processes of this machine
  std::string master_addr;  ///< MASTER_ADDR: the host of rank 0, which serves the TCPStore
  int64_t master_port = 0;  ///< MASTER_PORT: the TCPStore's port on MASTER_ADDR
};

/// Reads RANK, WORLD_SIZE, LOCAL_RANK (default: RANK), MASTER_ADDR and MASTER_PORT. Throws
/// c10::ValueError naming the variable that is missing or bad: not an integer, WORLD_SIZE < 1,
/// RANK or LOCAL_RANK outside [0, WORLD_SIZE), an empty MASTER_ADDR, MASTER_PORT outside
/// [1, 65535].
Environment read_environment();

}  // namespace distributed
}  // namespace gpipe

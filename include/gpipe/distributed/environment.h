// Environment: who this process is in a multi-process pipeline, read from the variables torchrun
// sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...); gpipe_launch sets the same.
//
// Under torchrun, the agent of the first machine already serves a store at MASTER_ADDR:MASTER_PORT
// and says so with TORCHELASTIC_USE_AGENT_STORE=True: every rank then joins that store, rank 0
// included. A group that torchrun restarts (--max-restarts) meets in the same store again, so
// each attempt (TORCHELASTIC_RESTART_COUNT) keeps its keys apart (rendezvous.h).
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
  int64_t rank = 0;              ///< RANK: 0 <= rank < world_size
  int64_t world_size = 1;        ///< WORLD_SIZE: the number of processes
  int64_t local_rank = 0;        ///< LOCAL_RANK: the rank among the processes of this machine
  int64_t local_world_size = 1;  ///< LOCAL_WORLD_SIZE: the number of processes on this machine
  int64_t group_rank = 0;        ///< GROUP_RANK: this machine's rank (torchrun's node rank)
  std::string master_addr;       ///< MASTER_ADDR: the host that serves the TCPStore
  int64_t master_port = 0;       ///< MASTER_PORT: the TCPStore's port on MASTER_ADDR
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves the store, not rank 0.
  bool agent_store = false;
  std::string run_id;         ///< TORCHELASTIC_RUN_ID: the job's id under torchrun, else empty
  int64_t restart_count = 0;  ///< TORCHELASTIC_RESTART_COUNT: how often the group was restarted

  /// Who serves the store: "rank 0", or "torchrun's agent" under TORCHELASTIC_USE_AGENT_STORE.
  std::string store_server() const;
};

/// Reads RANK, WORLD_SIZE, LOCAL_WORLD_SIZE (default: WORLD_SIZE), LOCAL_RANK (default: RANK
/// modulo LOCAL_WORLD_SIZE),
/// GROUP_RANK (default 0), MASTER_ADDR, MASTER_PORT and torchrun's TORCHELASTIC_USE_AGENT_STORE
/// (True or False, default False), TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT (default
/// 0). Throws c10::ValueError naming the variable that is missing or bad: not an integer,
/// WORLD_SIZE < 1, RANK outside [0, WORLD_SIZE), LOCAL_WORLD_SIZE outside [1, WORLD_SIZE],
/// LOCAL_RANK outside [0, LOCAL_WORLD_SIZE), a negative GROUP_RANK or TORCHELASTIC_RESTART_COUNT,
/// an empty MASTER_ADDR, MASTER_PORT outside [1, 65535].
Environment read_environment();

}  // namespace distributed
}  // namespace gpipe

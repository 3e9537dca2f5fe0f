// Starts the ranks of a multi-process gpipe program on this machine (see launcher.cpp for what
// each rank gets and how failures end the run). Needs no LibTorch.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace gpipe {
namespace launcher {

/// Runs `-n N [--master-addr A] [--master-port P] [--grace S] [--max-restarts K] -- program
/// [args...]`; messages start with `name`. Returns 0 when every rank of an attempt exits 0, 1
/// when one fails in the last, 2 for a bad command line (after printing the usage), 128 +
/// signal when interrupted. --help or -h before `--` prints the usage on stdout and returns 0.
int launch(const std::vector<std::string>& args, const std::string& name);

/// A port of 127.0.0.1 that nothing is bound to now, picked at random below ephemeral_ports()
/// (where no outgoing connection takes it in the meantime), else one the kernel picks; 0 if
/// none was had.
int free_port();

/// The ports the kernel hands outgoing connections (ip_local_port_range), first and last.
std::pair<int, int> ephemeral_ports();

}  // namespace launcher
}  // namespace gpipe

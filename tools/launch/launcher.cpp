// The launcher behind `gpipe launch` and `gpipe_launch`: starts the N ranks of a multi-process
// gpipe program on this machine, as `torchrun --standalone --nproc-per-node N --no-python` would.
//
// Usage: gpipe launch -n N ... or gpipe_launch -n N [--master-addr A] [--master-port P] [--grace S]
// [--max-restarts K] -- program [args...]
//
// Each rank runs `program args` with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR (default 127.0.0.1) and MASTER_PORT (default: a free port) set. When a rank exits
// non-zero or is killed, the others get S seconds (default 30) to finish failing on their own,
// then are killed. Then, up to K times (default 0), all ranks start again, as under torchrun
// --max-restarts: TORCHELASTIC_RESTART_COUNT says which restart, and the port is a new free one
// unless given. It exits 0 when every rank of an attempt does, else 1 naming the first rank that
// failed in the last. SIGINT and SIGTERM are passed on to the ranks and end the job.
#include "launcher.h"

#include "arguments.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

volatile sig_atomic_t g_signal = 0;
std::string g_name = "gpipe_launch";  // how messages name the launcher

void on_signal(int signal) { g_signal = signal; }

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr, "%s: %s\n", g_name.c_str(), problem.c_str());
  std::exit(2);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

// What run_ranks returns when a rank could not be started.
constexpr long kNotStarted = -2;

// Starts the `n` ranks of attempt `attempt` (0, then 1 for the first restart, ...) and waits for
// all of them. When one fails, the others get `grace` seconds to fail on their own, then are
// killed. Returns the rank that failed first, -1 if none did, kNotStarted if fork failed.
long run_ranks(int64_t n, const std::string& addr, int64_t port, int64_t grace, int64_t attempt,
               std::vector<char*>& argv) {
  std::vector<pid_t> pids(n, -1);
  for (long rank = 0; rank < n; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror((g_name + ": fork").c_str());
      for (long r = 0; r < rank; ++r) kill(pids[r], SIGKILL);
      return kNotStarted;
    }
    if (pid == 0) {
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("GROUP_RANK", "0", 1);
      setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt).c_str(), 1);
      // Rank 0 serves the store, even where this launcher itself runs under torchrun.
      unsetenv("TORCHELASTIC_USE_AGENT_STORE");
      execvp(argv[0], argv.data());
      std::fprintf(stderr, "%s: cannot run %s: %s\n", g_name.c_str(), argv[0],
                   std::strerror(errno));
      _exit(127);
    }
    pids[rank] = pid;
  }
  using Clock = std::chrono::steady_clock;
  long running = n;
  long first_failed = -1;
  Clock::time_point deadline;
  bool forwarded = false;
  while (running > 0) {
    if (g_signal != 0 && !forwarded) {
      for (const pid_t pid : pids) {
        if (pid > 0) kill(pid, g_signal);
      }
      forwarded = true;
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      long rank = 0;
      while (rank < n && pids[rank] != pid) ++rank;
      if (rank == n) continue;
      pids[rank] = -1;
      --running;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        std::fprintf(stderr, "%s: rank %ld %s\n", g_name.c_str(), rank, describe(status).c_str());
        if (first_failed < 0) {
          first_failed = rank;
          deadline = Clock::now() + std::chrono::seconds(grace);
        }
      }
      continue;
    }
    if (first_failed >= 0 && Clock::now() >= deadline) {
      for (long rank = 0; rank < n; ++rank) {
        if (pids[rank] <= 0) continue;
        std::fprintf(stderr, "%s: killing rank %ld, still running %ld s after rank %ld failed\n",
                     g_name.c_str(), rank, grace, first_failed);
        kill(pids[rank], SIGKILL);
      }
      deadline = Clock::now() + std::chrono::hours(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return first_failed;
}

}  // namespace

namespace gpipe {
namespace launcher {

int launch(const std::vector<std::string>& args, const std::string& name) {
  g_name = name;
  // The launcher's own flags come before --, the program and its arguments after.
  const auto separator = std::find(args.begin(), args.end(), "--");
  std::vector<std::string> own(args.begin(), separator);
  std::vector<std::string> program;
  if (separator != args.end()) program.assign(separator + 1, args.end());

  int64_t n = 0;
  int64_t port = 0;
  int64_t grace = 30;
  int64_t max_restarts = 0;
  std::string addr = "127.0.0.1";
  const auto app = gpipe::cli::command_line(
      name + " -n N [flags] -- program [args...]",
      "Starts the N ranks of a multi-process program on this machine, each with RANK,\n"
      "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as\n"
      "torchrun --standalone does.");
  app->add_option("-n,--nproc", n, "ranks to start (required)")
      ->type_name("N")
      ->default_str("")
      ->check(gpipe::cli::in_range(1, 4096));
  app->add_option("--master-addr", addr, "address of rank 0's store")->type_name("ADDR");
  app->add_option("--master-port", port, "port of rank 0's store (0: a free one)")
      ->type_name("PORT")
      ->check(gpipe::cli::in_range(0, 65535));
  app->add_option("--grace", grace, "seconds the other ranks get to fail after one fails")
      ->type_name("S")
      ->check(gpipe::cli::in_range(0, 86400));
  app->add_option("--max-restarts", max_restarts,
                  "times all ranks are started again after one fails, as torchrun's")
      ->type_name("K")
      ->check(gpipe::cli::in_range(0, 1000000));
  // --help or -h among the launcher's own flags (not the program's, after --) wins.
  if (gpipe::cli::asks_for_help(own)) {
    std::fputs(app->help().c_str(), stdout);
    return 0;
  }
  try {
    gpipe::cli::parse(*app, own);
  } catch (const gpipe::cli::UsageError& error) {
    usage(error.what());
  }
  if (n == 0) usage("-n N is required (see --help)");
  if (program.empty()) usage("no program after -- (see --help)");
  // execvp wants argv: the program, then its arguments, then null.
  std::vector<char*> argv;
  for (auto& word : program) argv.push_back(word.data());
  argv.push_back(nullptr);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  const bool fixed_port = port != 0;
  for (int64_t attempt = 0;; ++attempt) {
    if (!fixed_port && (port = free_port()) == 0) {
      std::perror((g_name + ": cannot find a free port").c_str());
      return 1;
    }
    const long failed = run_ranks(n, addr, port, grace, attempt, argv);
    if (failed == kNotStarted) return 1;
    if (failed < 0) return g_signal != 0 ? 128 + g_signal : 0;
    if (g_signal != 0 || attempt == max_restarts) {
      std::fprintf(stderr, "%s: failed: rank %ld failed first\n", g_name.c_str(), failed);
      return 1;
    }
    std::fprintf(stderr, "%s: restarting all %lld ranks (restart %lld of %lld)\n", g_name.c_str(),
                 static_cast<long long>(n), static_cast<long long>(attempt + 1),
                 static_cast<long long>(max_restarts));
  }
}

namespace {

// Binds a socket to `port` of 127.0.0.1 (0: one the kernel picks) and returns the port bound, or
// 0 if it is taken.
int bind_loopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof(address);
  const bool bound = fd >= 0 &&
                     bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  if (fd >= 0) close(fd);
  return bound ? ntohs(address.sin_port) : 0;
}

}  // namespace

std::pair<int, int> ephemeral_ports() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  if (range >> low >> high && 0 < low && low <= high && high < 65536) return {low, high};
  return {32768, 60999};  // Linux's default
}

int free_port() {
  // Below the ephemeral range: a port the kernel picks for us is one it may hand any outgoing
  // connection (a store's client, Gloo's mesh) before rank 0 listens on it.
  const int first_ephemeral = ephemeral_ports().first;
  const int low = std::max(1024, first_ephemeral - 20000);
  const int high = first_ephemeral - 1;
  if (low < high) {
    std::mt19937 random(std::random_device{}());
    std::uniform_int_distribution<int> pick(low, high);
    for (int attempt = 0; attempt < 64; ++attempt) {
      if (const int port = bind_loopback(pick(random))) return port;
    }
  }
  return bind_loopback(0);
}

}  // namespace launcher
}  // namespace gpipe

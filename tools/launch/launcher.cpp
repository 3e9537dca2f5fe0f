// The launcher behind `gpipe launch` and `gpipe_launch`: starts the N ranks of a multi-process
// gpipe program on this machine, as `torchrun --standalone --nproc-per-node N --no-python` would.
//
// Usage: gpipe launch -n N ... or gpipe_launch -n N [--master-addr A] [--master-port P] [--grace S]
// -- program [args...]
//
// Each rank runs `program args` with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR (default 127.0.0.1) and MASTER_PORT (default: a free port) set. When a rank exits
// non-zero or is killed, the others get S seconds (default 30) to finish failing on their own,
// then are killed; gpipe_launch exits 1 naming the first rank that failed. It exits 0 when every
// rank does. SIGINT and SIGTERM are passed on to the ranks.
#include "launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

volatile sig_atomic_t g_signal = 0;
std::string g_name = "gpipe_launch";  // how messages name the launcher

void on_signal(int signal) { g_signal = signal; }

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: %s -n N [--master-addr A] [--master-port P] [--grace S] -- "
               "program [args...]\n",
               g_name.c_str());
}

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr, "%s: %s\n", g_name.c_str(), problem.c_str());
  print_usage(stderr);
  std::exit(2);
}

long number(const std::string& flag, const char* text, long low, long high) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < low || value > high) {
    usage(flag + " must be an integer in [" + std::to_string(low) + ", " + std::to_string(high) +
          "], but is '" + text + "'");
  }
  return value;
}

// A port that nothing listens on now (the kernel picks it).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    std::perror((g_name + ": cannot find a free port").c_str());
    std::exit(1);
  }
  close(fd);
  return ntohs(address.sin_port);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

}  // namespace

namespace gpipe {
namespace launcher {

int launch(const std::vector<std::string>& args, const std::string& name) {
  g_name = name;
  // execvp wants argv: the name, then the arguments, then null.
  std::vector<std::string> words = args;
  words.insert(words.begin(), name);
  std::vector<char*> pointers;
  for (auto& word : words) pointers.push_back(word.data());
  pointers.push_back(nullptr);
  const int argc = static_cast<int>(words.size());
  char** argv = pointers.data();
  long n = 0;
  long port = 0;
  long grace = 30;
  std::string addr = "127.0.0.1";
  // --help or -h among the launcher's own flags (not the program's, after --) wins.
  for (int k = 1; k < argc && std::string(argv[k]) != "--"; ++k) {
    if (std::string(argv[k]) == "--help" || std::string(argv[k]) == "-h") {
      print_usage(stdout);
      return 0;
    }
  }
  int k = 1;
  for (; k < argc; ++k) {
    const std::string arg = argv[k];
    if (arg == "--") {
      ++k;
      break;
    }
    if (k + 1 >= argc) usage("missing value for " + arg);
    if (arg == "-n" || arg == "--nproc") {
      n = number(arg, argv[++k], 1, 4096);
    } else if (arg == "--master-port") {
      port = number(arg, argv[++k], 1, 65535);
    } else if (arg == "--master-addr") {
      addr = argv[++k];
    } else if (arg == "--grace") {
      grace = number(arg, argv[++k], 0, 86400);
    } else {
      usage("unknown option " + arg);
    }
  }
  if (n == 0) usage("-n N is required");
  if (k >= argc) usage("no program after --");
  if (port == 0) port = free_port();

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  std::vector<pid_t> pids(n, -1);
  for (long rank = 0; rank < n; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror((g_name + ": fork").c_str());
      for (long r = 0; r < rank; ++r) kill(pids[r], SIGKILL);
      return 1;
    }
    if (pid == 0) {
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      execvp(argv[k], argv + k);
      std::fprintf(stderr, "%s: cannot run %s: %s\n", g_name.c_str(), argv[k],
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
  if (first_failed >= 0) {
    std::fprintf(stderr, "%s: failed: rank %ld failed first\n", g_name.c_str(), first_failed);
    return 1;
  }
  return g_signal != 0 ? 128 + g_signal : 0;
}

}  // namespace launcher
}  // namespace gpipe

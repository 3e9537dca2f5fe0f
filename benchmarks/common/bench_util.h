// What every benchmark shares: its flags (--paper, --json FILE, --rounds N, --help), medians, a
// plain-text table and the JSON report. Header-only: each benchmark is one main.cpp.
//
// Every benchmark runs at a size this project's 2-core CPU machine finishes in about a minute,
// or with --paper at torchgpipe's sizes (benchmarks/*/main.py of the reference), which need a
// GPU-class machine: a single CPU core would take hours, and memory grows to tens of GiB.
#pragma once

#include "gpipe/cpu_malloc.h"
#include "gpipe/memory.h"
#include "gpipe/schedule/schedule_kind.h"
#include "launcher.h"

#include <c10/util/irange.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace gpipe {
namespace bench {

/// Stages per rank a benchmark gives the schedule named `schedule`: 2 for the kinds that loop
/// stages or place them in a V, else 1.
inline int64_t stages_per_rank(const std::string& schedule) {
  const schedule::ScheduleKind kind = schedule::parse_schedule_kind(schedule);
  return schedule::loops_stages(kind) || schedule::placement_of(kind) == schedule::Placement::kV
             ? 2
             : 1;
}

/// The command line of a benchmark.
struct Args {
  bool paper = false;  ///< --paper: the reference's sizes instead of this machine's
  int rounds = 0;      ///< --rounds N: measurements per contender, the median is reported
  std::string json;    ///< --json FILE: where the report goes; default <name>.json in the cwd
};

/// A flag of one benchmark's own, "--name VALUE".
struct Flag {
  std::string name;    ///< "--device"
  std::string* value;  ///< holds the default; parse_args sets it from the command line
  std::string help;    ///< what --help says of it, one line
};

/// Parses argv: the common flags and `own`. Prints the usage and exits 0 on --help; prints an
/// error and exits 2 on a bad or unknown flag. `about` is the benchmark's one-paragraph
/// description for --help. Also keeps freed memory for reuse (gpipe/cpu_malloc.h), for stable
/// timings.
inline Args parse_args(int argc, char** argv, const std::string& name, const std::string& about,
                       int default_rounds, const std::vector<Flag>& own = {}) {
  gpipe::memory::reuse_freed_cpu_memory();  // stable timings: no page faults from freed memory
  Args args;
  args.rounds = default_rounds;
  args.json = name + ".json";
  std::string own_usage, own_help;
  for (const Flag& flag : own) {
    own_usage += " [" + flag.name + " VALUE]";
    const size_t pad = flag.name.size() < 11 ? 13 - flag.name.size() : 2;
    own_help +=
        "  " + flag.name + std::string(pad, ' ') + flag.help + " (default '" + *flag.value + "')\n";
  }
  auto usage = [&](std::FILE* out) {
    std::fprintf(out,
                 "usage: %s [--paper] [--rounds N] [--json FILE]%s\n\n%s\n\n"
                 "  --paper      torchgpipe's sizes (the reference's benchmarks/%s); they need a\n"
                 "               GPU-class machine: on a CPU they take hours and tens of GiB\n"
                 "  --rounds N   measurements per contender, reported as the median (default %d)\n"
                 "  --json FILE  write the configuration and the results as JSON\n"
                 "               (default %s.json in the current directory)\n%s",
                 name.c_str(), own_usage.c_str(), about.c_str(), name.c_str(), default_rounds,
                 name.c_str(), own_help.c_str());
  };
  auto fail = [&](const std::string& message) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), message.c_str());
    usage(stderr);
    std::exit(2);
  };
  for (int k = 1; k < argc; ++k) {
    const std::string flag = argv[k];
    if (flag == "--help" || flag == "-h") {
      usage(stdout);
      std::exit(0);
    } else if (flag == "--paper") {
      args.paper = true;
    } else if (flag == "--rounds" || flag == "--json") {
      if (k + 1 == argc) fail(flag + " needs a value");
      const std::string value = argv[++k];
      if (flag == "--json") {
        args.json = value;
      } else {
        char* end = nullptr;
        const long rounds = std::strtol(value.c_str(), &end, 10);
        if (*end != '\0' || rounds < 1 || rounds > 1000) fail("bad --rounds " + value);
        args.rounds = static_cast<int>(rounds);
      }
    } else {
      const auto it =
          std::find_if(own.begin(), own.end(), [&](const Flag& f) { return f.name == flag; });
      if (it == own.end()) fail("unknown argument " + flag);
      if (k + 1 == argc) fail(flag + " needs a value");
      *it->value = argv[++k];
    }
  }
  return args;
}

inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

inline double mib(double bytes) { return bytes / (1 << 20); }

/// Reads the command line's "--name value" pairs into the integers `flags` names. Returns false,
/// after a message, for a flag it does not name.
inline bool read_int_flags(int argc, char** argv, const std::map<std::string, int64_t*>& flags) {
  for (int k = 1; k < argc; k += 2) {
    const auto it = flags.find(argv[k]);
    if (it == flags.end() || k + 1 == argc) {
      std::fprintf(stderr, "unknown flag or missing value: %s\n", argv[k]);
      return false;
    }
    *it->second = std::atoll(argv[k + 1]);
  }
  return true;
}

/// Sets OpenBLAS's thread count where LibTorch uses OpenBLAS: one process-wide count, which
/// at::set_num_threads does not change.
inline void set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  static auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set) set(threads);
}

/// True where set_blas_threads can set a count.
inline bool blas_threads_settable() {
  return dlsym(RTLD_DEFAULT, "openblas_set_num_threads") != nullptr;
}

/// Runs `command` under sh, its stderr with its stdout into `output`; returns its exit code (-1
/// where it did not exit or could not start).
inline int run_command(const std::string& command, std::string* output) {
  std::FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Sets what a rank of a job of `ranks` processes on this machine reads (RANK, LOCAL_RANK,
/// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR 127.0.0.1 and MASTER_PORT `port`), as torchrun
/// would: in a forked child, before it execs the rank.
inline void set_rank_environment(int64_t rank, int64_t ranks, const std::string& port) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(ranks).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port.c_str(), 1);
}

/// Runs this program again as `ranks` processes of one job on this machine
/// (set_rank_environment, a free port), each with `args` (args[0] is the program's name); waits
/// for them. Returns true if every rank exited 0.
inline bool run_ranks_of_this_program(int ranks, const std::vector<std::string>& args) {
  const std::string port = std::to_string(launcher::free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < ranks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      set_rank_environment(rank, ranks, port);
      std::vector<std::string> copy = args;
      std::vector<char*> pointers;
      for (auto& a : copy) pointers.push_back(a.data());
      pointers.push_back(nullptr);
      execv("/proc/self/exe", pointers.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (const pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

/// The Python of the torch wheel's virtual environment that scripts/setup.sh makes:
/// $GPIPE_VENV/bin/python, else ~/.cache/gpipe/venv/bin/python.
inline std::string default_python() {
  if (const char* venv = std::getenv("GPIPE_VENV")) return std::string(venv) + "/bin/python";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/gpipe/venv/bin/python";
}

/// Waits for `device`'s work (nothing on the CPU, whose work is done when it returns).
inline void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// "12.35" for fixed(12.345, 2).
inline std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

/// "1.234x".
inline std::string times(double ratio) { return fixed(ratio, 3) + "x"; }

/// "1.20 / 1.50 / 2.10": the least, the median and the largest of `values`, each as `format`
/// writes it; "-" for none.
inline std::string min_median_max(const std::vector<double>& values,
                                  const std::function<std::string(double)>& format) {
  if (values.empty()) return "-";
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  return format(*low) + " / " + format(median(values)) + " / " + format(*high);
}

/// The items of a comma-separated list, "a,b,,c" as {"a", "b", "c"}.
inline std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> items;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

/// "[1, 2, 3]".
inline std::string list(const std::vector<int64_t>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t k = 0; k < values.size(); ++k) out << (k ? ", " : "") << values[k];
  out << "]";
  return out.str();
}

/// The peak memory of what runs between start() and peak() on some devices, above what they
/// held at start(), summed over the devices (each counted once): the tracking allocator's bytes
/// for the CPU (install it first), the caching allocator's for a CUDA device.
class PeakMeter {
 public:
  explicit PeakMeter(const std::vector<c10::Device>& devices) {
    for (const auto& device : devices) {
      if (std::find(devices_.begin(), devices_.end(), device) == devices_.end()) {
        devices_.push_back(device);
      }
    }
  }
  void start() {
    before_.clear();
    for (const auto& device : devices_) {
      before_.push_back(memory::current_bytes(device));
      memory::reset_peak(device);
    }
  }
  int64_t peak() const {
    int64_t total = 0;
    for (size_t k = 0; k < devices_.size(); ++k) {
      total += memory::peak_bytes(devices_[k]) - before_[k];
    }
    return total;
  }

 private:
  std::vector<c10::Device> devices_;
  std::vector<int64_t> before_;
};

/// A table printed with aligned columns: the first left-aligned, the others right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) {
    row.resize(rows_[0].size());
    rows_.push_back(std::move(row));
  }
  void print() const {
    std::vector<size_t> widths(rows_[0].size(), 0);
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
    }
    for (size_t r = 0; r < rows_.size(); ++r) {
      std::string line;
      for (size_t c = 0; c < rows_[r].size(); ++c) {
        const std::string& cell = rows_[r][c];
        const std::string pad(widths[c] - cell.size(), ' ');
        line += c == 0 ? cell + pad : "  " + pad + cell;
      }
      std::printf("%s\n", line.c_str());
      if (r == 0) std::printf("%s\n", std::string(line.size(), '-').c_str());
    }
    std::fflush(stdout);
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

/// Writes `report` (the benchmark's configuration and results) to args.json, and says where.
inline void write_json(const Args& args, const nlohmann::json& report) {
  std::ofstream out(args.json);
  out << report.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", args.json.c_str());
    std::exit(1);
  }
  std::printf("\nwrote %s\n", args.json.c_str());
}

}  // namespace bench
}  // namespace gpipe

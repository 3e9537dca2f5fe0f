// gpipe's ranks (distributed::PipelineStage) against PyTorch's torch.distributed.pipelining
// (pipelining.py next to this file, run by the torch wheel's Python), side by side: the same
// model, weights, batch, micro-batches, stage layout and schedule, W processes over Gloo on the
// CPU, 1 intra-op thread each. Prints, per model x processes x schedule, the median step time of
// both, PyTorch's over gpipe's (gpipe's speedup), each rank's peak memory and how far the losses
// and gradients of the two differ.
//
// Models (both L x (Linear(H, H) + Tanh), MSE loss against a fixed target):
//   compute: 16 x Linear(1024), batch 4096, M = 8 (a step is mostly matrix products)
//   small:   32 x Linear(64),   batch 256,  M = 32 (a step is mostly scheduling and messages)
// Schedules (gpipe's name: PyTorch's class, stages per rank):
//   gpipe: ScheduleGPipe, 1          1f1b: Schedule1F1B, 1
//   interleaved_1f1b: ScheduleInterleaved1F1B, 2
//   zb1p: ScheduleInterleavedZeroBubble, 1    interleaved_zb1p: the same, 2
//   zbv: ScheduleZBVZeroBubble, 2 (V)         looped_bfs: ScheduleLoopedBFS, 2 (not by default)
// Rank r holds stages r, r + W (or r and 2W - 1 - r under ZBV) on both sides; stage s of S holds
// layers [s L / S, (s + 1) L / S).
//
// Same weights: every weight, the input and the target come from a formula (formula() here and
// in pipelining.py) computed in float64 by the same LibTorch (gpipe links the wheel's), then
// rounded to float32, so both sides start bit for bit equal. No optimizer step: each step sets
// the gradients to none and recomputes them, so the last step's gradients compare.
//
// Each round starts W ranks of this program (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as
// distributed_throughput does) and then W ranks of the script, or the other way around on odd
// rounds, so that a shared machine's swings hit both. Each rank runs --warmup steps, then --steps
// timed ones. A step's time is the longest of the ranks' step() calls; the median is over every
// timed step of every round. Peak memory: a rank's peak resident set (VmHWM) above its resident
// set just before the first step (model and batch built, freed heap memory given back and the
// peak reset: settled_rss_kib()), the largest over the rounds; both sides run with the same
// glibc malloc settings (gpipe/cpu_malloc.h: freed memory kept for reuse; the script gets them
// through GLIBC_TUNABLES).
//
// Usage: peers [--rounds N] [--steps R] [--warmup K] [--models compute,small]
//              [--processes 2,4] [--schedules gpipe,1f1b,...] [--compute-batch N]
//              [--compute-chunks M] [--receive-window W] [--python PY] [--timeout S]
//              [--json FILE]
// --receive-window: gpipe's PipelineStageOptions::receive_window (default 0, automatic).
// --python defaults to $GPIPE_VENV/bin/python, else ~/.cache/gpipe/venv/bin/python.
#include "common/bench_util.h"

#include "gpipe/cpu_malloc.h"
#include "gpipe/distributed/pipeline_stage.h"
#include "gpipe/schedule/generators.h"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpipe::bench;
namespace gs = gpipe::schedule;

// Malloc settings of reuse_freed_cpu_memory(), for the script (cpu_malloc.h).
constexpr const char* kTunables =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295:"
    "glibc.malloc.arena_max=1";

struct Model {
  std::string name;
  int64_t width, layers, batch, chunks;
};

// One run of one contender: W ranks.
struct Config {
  Model model;
  int64_t processes = 2;
  std::string schedule;
  int64_t steps = 3, warmup = 1;
  int64_t receive_window = 0;  // gpipe's PipelineStageOptions::receive_window
};

// n values in [-0.5, 0.5) from a hash of their index; pipelining.py's formula().
at::Tensor formula(int64_t n, double salt) {
  const at::Tensor k = torch::arange(n, torch::kFloat64);
  const at::Tensor x = torch::sin(k * 12.9898 + salt * 78.233) * 43758.5453;
  return x - torch::floor(x) - 0.5;
}

torch::nn::Sequential make_model(const Model& m) {
  torch::NoGradGuard no_grad;
  const double scale = std::sqrt(12.0 / static_cast<double>(m.width));
  torch::nn::Sequential model;
  for (int64_t layer = 0; layer < m.layers; ++layer) {
    torch::nn::Linear linear(m.width, m.width);
    linear->weight.copy_((formula(m.width * m.width, 2.0 * layer + 1) * scale)
                             .to(torch::kFloat32)
                             .reshape({m.width, m.width}));
    linear->bias.copy_((formula(m.width, 2.0 * layer + 2) * scale).to(torch::kFloat32));
    model->push_back(linear);
    model->push_back(torch::nn::Tanh());
  }
  return model;
}

std::pair<at::Tensor, at::Tensor> make_batch(const Model& m) {
  return {(formula(m.batch * m.width, -1) * 2.0).to(torch::kFloat32).reshape({m.batch, m.width}),
          (formula(m.batch * m.width, -2) * 2.0).to(torch::kFloat32).reshape({m.batch, m.width})};
}

int64_t status_kib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1);
  }
  return 0;
}

// CPU seconds this process has used, every thread's (user and system): pipelining.py's
// time.process_time().
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// The resident set the step starts from: freed heap memory (building the model and batch) given
// back, so that the step cannot reuse it unseen, and the peak (VmHWM) reset to it.
// pipelining.py's settled_rss() does the same.
int64_t settled_rss_kib() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
  return status_kib("VmRSS");
}

at::Tensor mse(const gpipe::Batch& output, const gpipe::Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

// One gpipe rank: writes <out>.rank<r>.json and .pt as pipelining.py does.
int run_rank(const Config& c, const std::string& out) {
  at::set_num_threads(1);
  const int64_t per_rank = stages_per_rank(c.schedule);
  const int64_t num_stages = c.processes * per_rank;
  const int64_t per_stage = c.model.layers / num_stages;
  auto model = make_model(c.model);
  const auto [input, target] = make_batch(c.model);
  const std::vector<int64_t> balance(num_stages, 2 * per_stage);
  const auto group = gpipe::distributed::rendezvous(gpipe::distributed::read_environment(),
                                                    std::chrono::seconds(120));
  const int64_t rank = group.rank();
  gpipe::distributed::PipelineStage pipe(group, model, balance, mse,
                                         gpipe::distributed::PipelineStageOptions(c.model.chunks)
                                             .receive_window(c.receive_window)
                                             .schedule(gs::parse_schedule_kind(c.schedule))
                                             .stages_per_worker(per_rank));
  const int64_t rss_before = settled_rss_kib();
  std::vector<double> steps, communication, cpu;
  double loss = 0;
  for (int64_t step = 0; step < c.warmup + c.steps; ++step) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    const double cpu_start = process_cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    loss = pipe.step(input, target).item<double>();
    const double elapsed = seconds_since(start);
    if (step < c.warmup) continue;
    steps.push_back(elapsed);
    cpu.push_back(process_cpu_seconds() - cpu_start);
    communication.push_back(pipe.last_communication_seconds());
  }
  // As pipelining.py: no rank writes its results, or exits, and takes a core for it while
  // another still runs its last step.
  group.group->barrier()->wait();
  const nlohmann::json report{{"steps", steps},
                              {"communication", communication},
                              {"cpu", cpu},
                              {"rss_before_kib", rss_before},
                              {"hwm_kib", status_kib("VmHWM")},
                              {"loss", loss}};
  c10::impl::GenericDict grads(c10::StringType::get(), c10::TensorType::get());
  for (int64_t layer = 0; layer < c.model.layers; ++layer) {
    auto linear = model[2 * layer]->as<torch::nn::Linear>();
    if (!linear->weight.grad().defined()) continue;
    grads.insert(std::to_string(layer) + ".weight", linear->weight.grad());
    grads.insert(std::to_string(layer) + ".bias", linear->bias.grad());
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(grads));
  const std::string prefix = out + ".rank" + std::to_string(rank);
  std::ofstream(prefix + ".pt", std::ios::binary).write(bytes.data(), bytes.size());
  std::ofstream(prefix + ".json") << report.dump() << "\n";
  group.group->barrier()->wait();
  return 0;
}

// What one run of a contender left: per rank its report and gradients; or why it failed.
struct Result {
  std::string error;  // empty when every rank succeeded
  std::vector<nlohmann::json> ranks;
  std::map<std::string, at::Tensor> grads;  // over all ranks
};

std::string tail_error(const std::string& log) {
  std::ifstream in(log);
  std::string line, found, last;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    last = line;
    if (line.find("Error") != std::string::npos || line.find("error") != std::string::npos) {
      found = line;
    }
  }
  return found.empty() ? last : found;
}

// Starts `processes` ranks of `command` (argv), waits for them at most `timeout` seconds (then
// kills them) and reads what they wrote under `prefix`.
Result launch(const std::vector<std::string>& command, int64_t processes, const std::string& prefix,
              bool python, double timeout) {
  const std::string port = std::to_string(gpipe::launcher::free_port());
  std::vector<pid_t> pids;
  for (int64_t rank = 0; rank < processes; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      set_rank_environment(rank, processes, port);
      setenv("OMP_NUM_THREADS", "1", 1);
      if (python) {
        setenv("GLIBC_TUNABLES", kTunables, 1);
        setenv("PYTHONWARNINGS", "ignore", 1);
      }
      const std::string log = prefix + ".rank" + std::to_string(rank) + ".log";
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<std::string> args = command;
      std::vector<char*> pointers;
      for (auto& a : args) pointers.push_back(a.data());
      pointers.push_back(nullptr);
      execv(args[0].c_str(), pointers.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  Result result;
  const auto start = std::chrono::steady_clock::now();
  std::vector<bool> done(pids.size(), false);
  double failed_at = -1;
  for (size_t left = pids.size(); left > 0;) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      done[r] = true;
      --left;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && result.error.empty()) {
        result.error = "rank " + std::to_string(r) + ": " +
                       tail_error(prefix + ".rank" + std::to_string(r) + ".log");
        failed_at = seconds_since(start);
      }
    }
    const double now = seconds_since(start);
    // A failed rank leaves the others waiting for it: 30 s, then they go too.
    if (left > 0 && (now > timeout || (failed_at >= 0 && now > failed_at + 30))) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (!done[r]) kill(pids[r], SIGKILL);
      }
      for (size_t r = 0; r < pids.size(); ++r) {
        if (!done[r]) waitpid(pids[r], nullptr, 0), done[r] = true;
      }
      if (result.error.empty()) result.error = "timed out after " + fixed(timeout, 0) + " s";
      left = 0;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!result.error.empty()) return result;
  for (int64_t rank = 0; rank < processes; ++rank) {
    const std::string base = prefix + ".rank" + std::to_string(rank);
    std::ifstream in(base + ".json");
    result.ranks.push_back(nlohmann::json::parse(in));
    std::ifstream pt(base + ".pt", std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(pt)),
                                  std::istreambuf_iterator<char>());
    for (const auto& item : torch::pickle_load(bytes).toGenericDict()) {
      result.grads[item.key().toStringRef()] = item.value().toTensor();
    }
  }
  return result;
}

// What the rounds of one contender add up to.
struct Totals {
  std::string error;
  std::vector<double> steps;          // each timed step: the slowest rank's time
  std::vector<double> round_steps;    // each round's median of `steps`
  std::vector<double> communication;  // gpipe: each step's mean over ranks of transport wait
  std::vector<double> cpu;            // each step's CPU seconds, summed over ranks
  std::vector<double> peak_mib;       // per rank, the largest over the rounds
  double loss = NAN;
  std::map<std::string, at::Tensor> grads;  // the last round's

  void add(const Result& r) {
    if (!r.error.empty()) {
      if (error.empty()) error = r.error;
      return;
    }
    const size_t n = r.ranks[0]["steps"].size();
    const size_t first = steps.size();
    peak_mib.resize(r.ranks.size(), 0);
    for (size_t s = 0; s < n; ++s) {
      double slowest = 0, comm = 0, used = 0;
      for (const auto& rank : r.ranks) {
        slowest = std::max(slowest, rank["steps"][s].get<double>());
        if (rank.contains("communication")) comm += rank["communication"][s].get<double>();
        used += rank["cpu"][s].get<double>();
      }
      steps.push_back(slowest);
      cpu.push_back(used);
      communication.push_back(comm / static_cast<double>(r.ranks.size()));
    }
    round_steps.push_back(median(std::vector<double>(steps.begin() + first, steps.end())));
    for (size_t k = 0; k < r.ranks.size(); ++k) {
      const auto& rank = r.ranks[k];
      const double peak = static_cast<double>(rank["hwm_kib"].get<int64_t>() -
                                              rank["rss_before_kib"].get<int64_t>()) /
                          1024.0;
      peak_mib[k] = std::max(peak_mib[k], peak);
      if (!rank["loss"].is_null() && std::isnan(loss)) loss = rank["loss"].get<double>();
    }
    grads = r.grads;
  }
};

std::string per_rank(const std::vector<double>& values) {
  std::string out;
  for (size_t k = 0; k < values.size(); ++k) out += (k ? "/" : "") + fixed(values[k], 0);
  return out.empty() ? "-" : out;
}

// The largest over the parameters of max |a - b| / max |b|; -1 where the names differ.
double grad_difference(const std::map<std::string, at::Tensor>& a,
                       const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size() || a.empty()) return -1;
  double worst = 0;
  for (const auto& [name, ga] : a) {
    const auto it = b.find(name);
    if (it == b.end()) return -1;
    const at::Tensor x = ga.to(torch::kFloat64), y = it->second.to(torch::kFloat64);
    const double scale = y.abs().max().item<double>();
    const double diff = (x - y).abs().max().item<double>();
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

// The first three fields of /proc/loadavg: how busy the machine was.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

std::string scientific(double value) {
  if (value < 0 || std::isnan(value)) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1e", value);
  return buffer;
}

}  // namespace

int main(int argc, char** argv) {
  gpipe::memory::reuse_freed_cpu_memory();
  set_blas_threads(1);
  int64_t rounds = 2, steps = 3, warmup = 1, compute_batch = 4096, compute_chunks = 8;
  int64_t receive_window = 0;
  double timeout = 600;
  std::string models = "compute,small", processes = "2,4",
              schedules = "gpipe,1f1b,interleaved_1f1b,zb1p,interleaved_zb1p,zbv",
              python = default_python(), json_path = "peers.json";
  // Rank mode (started by this program): the run's configuration.
  std::string rank_output, rank_schedule;
  int64_t width = 0, layers = 0, batch = 0, chunks = 0, world = 0;
  std::map<std::string, int64_t*> ints{{"--rounds", &rounds},
                                       {"--steps", &steps},
                                       {"--warmup", &warmup},
                                       {"--compute-batch", &compute_batch},
                                       {"--compute-chunks", &compute_chunks},
                                       {"--receive-window", &receive_window},
                                       {"--width", &width},
                                       {"--layers", &layers},
                                       {"--batch", &batch},
                                       {"--chunks", &chunks},
                                       {"--world", &world}};
  std::map<std::string, std::string*> strings{
      {"--models", &models},         {"--processes", &processes}, {"--schedules", &schedules},
      {"--python", &python},         {"--json", &json_path},      {"--rank-output", &rank_output},
      {"--schedule", &rank_schedule}};
  for (int k = 1; k < argc; k += 2) {
    const std::string flag = argv[k];
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "usage: peers [--rounds N] [--steps R] [--warmup K] [--models compute,small]\n"
          "             [--processes 2,4] [--schedules gpipe,1f1b,interleaved_1f1b,zb1p,\n"
          "             interleaved_zb1p,zbv] [--compute-batch N] [--compute-chunks M]\n"
          "             [--receive-window W] [--python PY] [--timeout S] [--json FILE]\n"
          "gpipe's ranks against torch.distributed.pipelining (see benchmarks/peers/main.cpp)\n");
      return 0;
    }
    if (k + 1 == argc) {
      std::fprintf(stderr, "peers: %s needs a value\n", flag.c_str());
      return 2;
    }
    if (flag == "--timeout") {
      timeout = std::atof(argv[k + 1]);
    } else if (ints.count(flag)) {
      *ints[flag] = std::atoll(argv[k + 1]);
    } else if (strings.count(flag)) {
      *strings[flag] = argv[k + 1];
    } else {
      std::fprintf(stderr, "peers: unknown flag %s (--help)\n", flag.c_str());
      return 2;
    }
  }
  if (!rank_output.empty()) {
    Config c{
        {"", width, layers, batch, chunks}, world, rank_schedule, steps, warmup, receive_window};
    return run_rank(c, rank_output);
  }

  const std::map<std::string, Model> known{
      {"compute", {"compute", 1024, 16, compute_batch, compute_chunks}},
      {"small", {"small", 64, 32, 256, 32}}};
  const std::string script = GPIPE_PEERS_SCRIPT;
  if (access(python.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "peers: no Python at %s (--python)\n", python.c_str());
    return 2;
  }
  unsigned cores = std::thread::hardware_concurrency();
  std::printf(
      "gpipe (distributed::PipelineStage) against torch.distributed.pipelining (torch %s), "
      "Gloo on the CPU, 1 intra-op thread per process, %u cores%s; %lld rounds x %lld timed "
      "steps (after %lld warm-up) per contender; step time: the slowest rank's, median\n",
      torch_version().c_str(), cores, "", (long long)rounds, (long long)steps, (long long)warmup);
  for (const auto& name : split_list(models)) {
    if (!known.count(name)) {
      std::fprintf(stderr, "peers: unknown model %s (compute, small)\n", name.c_str());
      return 2;
    }
    const Model& m = known.at(name);
    std::printf("  %s: %lld x (Linear(%lld, %lld) + Tanh), batch %lld, %lld micro-batches\n",
                name.c_str(), (long long)m.layers, (long long)m.width, (long long)m.width,
                (long long)m.batch, (long long)m.chunks);
  }
  std::fflush(stdout);

  char dir[] = "/tmp/gpipe_peers_XXXXXX";
  const std::string tmp = mkdtemp(dir);
  Table table({"model", "procs", "schedule", "gpipe ms", "torch ms", "speedup",
               "per round: min / median / max", "CPU gpipe/torch", "gpipe MiB/rank",
               "torch MiB/rank", "gpipe wait ms", "loss diff", "grad diff"});
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::string> errors;
  const auto begin = std::chrono::steady_clock::now();
  const std::string load_start = load_average();
  for (const auto& model_name : split_list(models)) {
    const Model& m = known.at(model_name);
    for (const auto& procs : split_list(processes)) {
      const int64_t w = std::atoll(procs.c_str());
      for (const auto& schedule : split_list(schedules)) {
        const std::string s = std::to_string(steps), wu = std::to_string(warmup);
        const std::vector<std::string> shape{"--width",    std::to_string(m.width),
                                             "--layers",   std::to_string(m.layers),
                                             "--batch",    std::to_string(m.batch),
                                             "--chunks",   std::to_string(m.chunks),
                                             "--schedule", schedule,
                                             "--steps",    s,
                                             "--warmup",   wu};
        Totals gp, pt;
        for (int64_t round = 0; round < rounds; ++round) {
          const std::string prefix =
              tmp + "/" + model_name + "_" + procs + "_" + schedule + "_r" + std::to_string(round);
          std::vector<std::string> gp_command{"/proc/self/exe", "--world", procs, "--rank-output",
                                              prefix + "_gpipe"};
          gp_command.insert(gp_command.end(), shape.begin(), shape.end());
          gp_command.insert(gp_command.end(), {"--receive-window", std::to_string(receive_window)});
          std::vector<std::string> pt_command{python, script, "--out", prefix + "_torch"};
          pt_command.insert(pt_command.end(), shape.begin(), shape.end());
          for (int k = 0; k < 2; ++k) {
            if ((k == 0) == (round % 2 == 0)) {
              gp.add(launch(gp_command, w, prefix + "_gpipe", false, timeout));
            } else {
              pt.add(launch(pt_command, w, prefix + "_torch", true, timeout));
            }
          }
        }
        const double gms = gp.steps.empty() ? NAN : median(gp.steps) * 1e3;
        const double tms = pt.steps.empty() ? NAN : median(pt.steps) * 1e3;
        const bool both = !gp.steps.empty() && !pt.steps.empty();
        // Each round's speedup: torch's median step over gpipe's, the two run back to back.
        std::vector<double> speedups;
        for (size_t r = 0; r < std::min(gp.round_steps.size(), pt.round_steps.size()); ++r) {
          speedups.push_back(pt.round_steps[r] / gp.round_steps[r]);
        }
        const std::string spread = min_median_max(speedups, times);
        const double loss_diff =
            both ? std::abs(gp.loss - pt.loss) / std::max(std::abs(pt.loss), 1e-30) : -1;
        const double grad_diff = both ? grad_difference(gp.grads, pt.grads) : -1;
        table.add({model_name, procs, schedule, gp.steps.empty() ? "error" : fixed(gms, 1),
                   pt.steps.empty() ? "error" : fixed(tms, 1), both ? times(tms / gms) : "-",
                   spread, both ? times(median(gp.cpu) / median(pt.cpu)) : "-",
                   per_rank(gp.peak_mib), per_rank(pt.peak_mib),
                   gp.communication.empty() ? "-" : fixed(median(gp.communication) * 1e3, 1),
                   scientific(loss_diff), scientific(grad_diff)});
        nlohmann::json row{{"model", model_name},
                           {"processes", w},
                           {"schedule", schedule},
                           {"gpipe_step_seconds", gp.steps},
                           {"torch_step_seconds", pt.steps},
                           {"gpipe_peak_mib", gp.peak_mib},
                           {"torch_peak_mib", pt.peak_mib},
                           {"gpipe_communication_seconds", gp.communication},
                           {"gpipe_cpu_seconds", gp.cpu},
                           {"torch_cpu_seconds", pt.cpu}};
        if (both) {
          row["speedup"] = tms / gms;
          row["speedup_per_round"] = speedups;
          row["loss_relative_difference"] = loss_diff;
          row["grad_relative_difference"] = grad_diff;
        }
        for (const auto* side : {&gp, &pt}) {
          if (side->error.empty()) continue;
          const std::string who = side == &gp ? "gpipe" : "torch";
          errors.push_back(model_name + " " + procs + " " + schedule + " " + who + ": " +
                           side->error);
          row[who + "_error"] = side->error;
        }
        rows.push_back(row);
        std::fprintf(stderr, "  [%.0f s] %s %s %s: gpipe %.1f ms, torch %.1f ms\n",
                     seconds_since(begin), model_name.c_str(), procs.c_str(), schedule.c_str(), gms,
                     tms);
      }
    }
  }
  std::printf("\n");
  table.print();
  std::printf(
      "\nspeedup: torch ms / gpipe ms (above 1: gpipe faster). CPU: the CPU time a "
      "step takes on all ranks together (every thread, user and system), median, gpipe's over "
      "torch's. MiB/rank: each rank's peak resident "
      "set above its resident set before the first step (freed memory given back). gpipe wait: "
      "mean over ranks of the time "
      "a step spends in sends and receives (includes waiting for other ranks: the bubble). loss "
      "diff: |gpipe - torch| / |torch|; grad diff: the largest over the parameters of "
      "max |gpipe - torch| / max |torch|.\n");
  for (const auto& procs : split_list(processes)) {
    if (std::atoll(procs.c_str()) > static_cast<long long>(cores)) {
      std::printf("note: %s processes on %u cores are oversubscribed: ranks take turns on them.\n",
                  procs.c_str(), cores);
    }
  }
  for (const auto& e : errors) std::printf("failed: %s\n", e.c_str());
  std::printf("total %.0f s; load average at the start %s, at the end %s\n", seconds_since(begin),
              load_start.c_str(), load_average().c_str());
  std::ofstream(json_path) << nlohmann::json{{"torch", torch_version()}, {"cores", cores},
                                             {"rounds", rounds},         {"steps", steps},
                                             {"warmup", warmup},         {"rows", rows}}
                                  .dump(2)
                           << "\n";
  std::printf("wrote %s\n", json_path.c_str());
  return errors.empty() ? 0 : 1;
}

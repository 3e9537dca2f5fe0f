// Throughput of pipelines across processes (c10d, Gloo over loopback) against the plain model and
// against the same schedules on threads of one process (ThreadTransport), side by side in one
// run: 2 stages x 1 intra-op thread. With M micro-batches the bubble bounds the speedup over the
// plain model on 1 thread at 2 * M / (M + 1) (1.78x for M = 8); efficiency is the speedup over
// that bound. Also prints, per rank and step, the time spent in the transport (blocked in sends
// and receives, which includes waiting for the other rank to compute: the bubble) and, of it,
// the time moving data (receiving tensors whose header has arrived, and the final flush; a batch
// that travels as one message arrives with its header, so only the bytes copied into it count).
// Default: 8 x Linear(1024, 1024) + Tanh, batch 2048, M = 8 (micro-batches of 256 rows).
//
// Usage: distributed_throughput [--width W] [--layers L] [--batch N] [--chunks M] [--repeats R]
//                               [--rounds K]
// Each of K rounds times R steps of every candidate (the in-process ones, then the processes);
// medians over all rounds.
//
// The program runs the in-process candidates itself, then starts 2 ranks of itself (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, as gpipe_launch would) and waits while they run.
// OpenBLAS keeps one process-wide thread count: every process sets it to 1 with
// openblas_set_num_threads where the library has it (see main() for why the in-process runs
// first run one step with 2). Every process keeps freed memory for reuse (gpipe/cpu_malloc.h).
#include "common/bench_util.h"

#include "gpipe/cpu_malloc.h"
#include "gpipe/distributed/pipeline_stage.h"
#include "gpipe/schedule/runtime.h"

#include <torch/torch.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

void set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  static auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set) set(threads);
}

struct Config {
  int64_t width = 1024, layers = 8, batch = 2048, chunks = 8, repeats = 5, rounds = 3;
};

torch::nn::Sequential make_model(const Config& c) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t k = 0; k < c.layers; ++k) {
    model->push_back(torch::nn::Linear(c.width, c.width));
    model->push_back(torch::nn::Tanh());
  }
  return model;
}

std::vector<int64_t> balance(const Config& c) {
  return {2 * c.layers - 2 * (c.layers / 2), 2 * (c.layers / 2)};
}

at::Tensor mse(const gpipe::Batch& output, const gpipe::Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

double seconds(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// One rank: times `repeats` steps of each schedule after a warm-up; writes
// "<schedule> <median step s> <median communication s>" lines to <out>.rank<r>.
int run_rank(const Config& c, const std::string& out) {
  at::set_num_threads(1);
  const at::Tensor input = torch::randn({c.batch, c.width});
  const at::Tensor target = torch::randn({c.batch, c.width});
  namespace gs = gpipe::schedule;
  std::ostringstream lines;
  // One rendezvous for both pipelines (see pipeline_stage.h).
  const auto group = gpipe::distributed::rendezvous(gpipe::distributed::read_environment(),
                                                    std::chrono::seconds(60));
  const int64_t rank = group.rank();
  for (const auto kind : {gs::ScheduleKind::kOneFOneB, gs::ScheduleKind::kGPipe}) {
    auto model = make_model(c);
    gpipe::distributed::PipelineStage pipe(
        group, model, balance(c), mse,
        gpipe::distributed::PipelineStageOptions(c.chunks).schedule(kind));
    std::vector<double> steps, comm, transfer;
    for (int64_t r = 0; r <= c.repeats; ++r) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      const double t = seconds([&] { pipe.step(input, target); });
      if (r == 0) continue;  // warm-up
      steps.push_back(t);
      comm.push_back(pipe.last_communication_seconds());
      transfer.push_back(pipe.last_transfer_seconds());
    }
    lines << kind << " " << median(steps) << " " << median(comm) << " " << median(transfer) << "\n";
  }
  std::ofstream(out + ".rank" + std::to_string(rank)) << lines.str();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gpipe::memory::reuse_freed_cpu_memory();
  set_blas_threads(1);
  Config c;
  std::string out;
  for (int k = 1; k + 1 < argc; k += 2) {
    const std::string flag = argv[k];
    if (flag == "--rank-output") {
      out = argv[k + 1];
      continue;
    }
    const int64_t value = std::atoll(argv[k + 1]);
    if (flag == "--width")
      c.width = value;
    else if (flag == "--layers")
      c.layers = value;
    else if (flag == "--batch")
      c.batch = value;
    else if (flag == "--chunks")
      c.chunks = value;
    else if (flag == "--repeats")
      c.repeats = value;
    else if (flag == "--rounds")
      c.rounds = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (!out.empty()) return run_rank(c, out);

  // In-process candidates, 1 intra-op thread per stage.
  at::set_num_threads(1);
  const at::Tensor input = torch::randn({c.batch, c.width});
  const at::Tensor target = torch::randn({c.batch, c.width});
  namespace gs = gpipe::schedule;
  auto plain = make_model(c);
  auto m1 = make_model(c);
  auto m2 = make_model(c);
  gs::PipelineSchedule one_f_one_b(
      m1, balance(c), mse,
      gs::PipelineScheduleOptions(c.chunks).schedule(gs::ScheduleKind::kOneFOneB));
  gs::PipelineSchedule fill_drain(
      m2, balance(c), mse,
      gs::PipelineScheduleOptions(c.chunks).schedule(gs::ScheduleKind::kGPipe));
  struct Candidate {
    std::string name;
    std::function<void()> step;
    std::vector<double> times = {};
  };
  std::vector<Candidate> candidates{
      {"plain, 1 thread (a)",
       [&] {
         plain->zero_grad();
         torch::mse_loss(plain->forward(input), target).backward();
       }},
      {"1F1B, threads (2 x 1)",
       [&] {
         m1->zero_grad();
         one_f_one_b.step(input, target);
       }},
      {"GPipe, threads (2 x 1)",
       [&] {
         m2->zero_grad();
         fill_drain.step(input, target);
       }},
  };
  // Debian 12's OpenBLAS (0.3.21, pthreads) serializes matrix products that several threads of
  // a process call at once unless it has run with more than one thread before: without this the
  // thread transport runs at about the plain model's speed (measured: 0.87-0.97x of (a) instead
  // of 1.5x). One step on 2 BLAS threads first, as schedule_throughput's plain (b) does.
  set_blas_threads(2);
  candidates[0].step();
  set_blas_threads(1);
  for (auto& cand : candidates) cand.step();  // warm up
  struct Rank {
    std::vector<double> steps, comm, transfer;
  };
  // [schedule: 1f1b, gpipe][rank]: the medians of each round.
  std::vector<std::vector<Rank>> ranks(2, std::vector<Rank>(2));
  for (int64_t round = 0; round < c.rounds; ++round) {
    for (int64_t r = 0; r < c.repeats; ++r) {
      for (auto& cand : candidates) cand.times.push_back(seconds(cand.step));
    }
    // The c10d candidates: 2 processes x 1 thread; this one waits meanwhile.
    char dir[] = "/tmp/gpipe_distributed_throughput_XXXXXX";
    const std::string results = std::string(mkdtemp(dir)) + "/result";
    std::vector<std::string> rank_args{argv[0], "--rank-output", results};
    for (int k = 1; k < argc; ++k) rank_args.push_back(argv[k]);
    const bool ok = gpipe::bench::run_ranks_of_this_program(2, rank_args);
    if (!ok) {
      std::fprintf(stderr, "a c10d rank failed\n");
      return 1;
    }
    for (int rank = 0; rank < 2; ++rank) {
      std::ifstream in(results + ".rank" + std::to_string(rank));
      std::string name;
      double step = 0, comm = 0, transfer = 0;
      for (int s = 0; s < 2 && (in >> name >> step >> comm >> transfer); ++s) {
        ranks[s][rank].steps.push_back(step);
        ranks[s][rank].comm.push_back(comm);
        ranks[s][rank].transfer.push_back(transfer);
      }
    }
  }
  const double bound = 2.0 * c.chunks / (c.chunks + 1);
  std::printf(
      "model: %lld x (Linear(%lld, %lld) + Tanh), batch %lld, %lld micro-batches, %lld rounds x "
      "%lld repeats (medians), 1 thread per stage (OpenBLAS threads: %s)\n",
      (long long)c.layers, (long long)c.width, (long long)c.width, (long long)c.batch,
      (long long)c.chunks, (long long)c.rounds, (long long)c.repeats,
      dlsym(RTLD_DEFAULT, "openblas_set_num_threads") ? "1" : "not settable");
  const double a = median(candidates[0].times);
  std::printf("%-28s %10s %12s %8s %11s %22s\n", "", "step (ms)", "samples/s", "vs (a)",
              "efficiency", "ms/step in transport / moving data (rank 0; rank 1)");
  for (const auto& cand : candidates) {
    const double t = median(cand.times);
    std::printf("%-28s %10.1f %12.1f %7.2fx %10.0f%%\n", cand.name.c_str(), t * 1e3, c.batch / t,
                a / t, 100 * a / t / (cand.name.rfind("plain", 0) == 0 ? 1.0 : bound));
  }
  const char* names[] = {"1F1B, c10d (2 procs x 1)", "GPipe, c10d (2 procs x 1)"};
  for (int s = 0; s < 2; ++s) {
    if (ranks[s][0].steps.empty()) continue;
    const double t = median(ranks[s][0].steps);
    const double thread_t = median(candidates[1 + s].times);
    std::printf(
        "%-28s %10.1f %12.1f %7.2fx %10.0f%%  %.1f / %.1f; %.1f / %.1f  (%.2fx of threads)\n",
        names[s], t * 1e3, c.batch / t, a / t, 100 * a / t / bound, median(ranks[s][0].comm) * 1e3,
        median(ranks[s][0].transfer) * 1e3, median(ranks[s][1].comm) * 1e3,
        median(ranks[s][1].transfer) * 1e3, thread_t / t);
  }
  std::printf("bubble bound over (a): 2 x %lld / %lld = %.2fx\n", (long long)c.chunks,
              (long long)(c.chunks + 1), bound);
  return 0;
}

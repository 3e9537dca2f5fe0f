// Throughput of explicit pipeline schedules (GPipe, 1F1B, ZB1P, ZBV, DualPipeV) on CPU threads
// against the plain model, side by side in one run: 2 workers x 1 intra-op thread each (ZBV and
// DualPipeV: 4 half-size stages in a V on them) vs (a) the plain model on 1 thread and (b) the
// plain model on 2 intra-op threads. With M micro-batches the bubble bounds
// the speedup of GPipe and 1F1B over (a) at 2 * M / (M + 1) (1.78x for M = 8); ZB1P's weight
// passes fill part of that bubble, and ZBV's more of it. Also prints each one's peak CPU tensor
// memory during a step (the tracking allocator), above what the model holds, in all and per
// stage, and the plain model
// run micro-batch by micro-batch on one thread: smaller matrix products cost more CPU time per
// sample (OpenBLAS packs the whole weight matrix on every call), which no schedule wins back.
// Default: 16 x Linear(1024, 1024) + Tanh, batch 4096, so micro-batches of 512 rows, which cost
// about 5% more per sample than the whole batch (256 rows: 12%, capping M = 8 below 1.6x).
//
// Usage: schedule_throughput [--width W] [--layers L] [--batch N] [--chunks M] [--repeats R]
//
// OpenBLAS keeps one process-wide thread count (at::set_num_threads does not change it), so this
// program sets it with openblas_set_num_threads where the library has it: 1 for the pipelines and
// (a), 2 for (b). It keeps freed memory for reuse (gpipe/cpu_malloc.h), or the pipelines' worker
// threads would fault their activations' pages in again on each step (6% of a 1F1B step here).
#include "common/bench_util.h"

#include "gpipe/cpu_malloc.h"
#include "gpipe/memory.h"
#include "gpipe/schedule/runtime.h"

#include <torch/torch.h>

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using gpipe::bench::median;

void set_threads(int threads) {
  at::set_num_threads(threads);
  gpipe::bench::set_blas_threads(threads);
}

torch::nn::Sequential make_model(int64_t width, int64_t layers) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t k = 0; k < layers; ++k) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::Tanh());
  }
  return model;
}

double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

// Wall-clock seconds of run(); adds its CPU seconds (all threads) to *cpu.
double seconds(const std::function<void()>& run, std::vector<double>* cpu) {
  const double cpu_start = cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  run();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cpu->push_back(cpu_seconds() - cpu_start);
  return wall;
}

struct Candidate {
  std::string name;
  std::function<void()> step;
  int64_t stages = 0;  // of a pipeline, whose stages' peaks are measured too
  std::vector<double> times = {};
  int64_t peak = 0;
  std::vector<int64_t> stage_peaks = {};
  std::vector<double> cpu = {};
};

}  // namespace

int main(int argc, char** argv) {
  gpipe::memory::reuse_freed_cpu_memory();
  int64_t width = 1024, layers = 16, batch = 4096, chunks = 8, repeats = 5;
  if (!gpipe::bench::read_int_flags(argc, argv,
                                    {{"--width", &width},
                                     {"--layers", &layers},
                                     {"--batch", &batch},
                                     {"--chunks", &chunks},
                                     {"--repeats", &repeats}})) {
    return 2;
  }
  gpipe::memory::install_tracking_cpu_allocator();
  const at::Tensor input = torch::randn({batch, width});
  const at::Tensor target = torch::randn({batch, width});
  auto loss = [](const gpipe::Batch& output, const gpipe::Batch& target) {
    return torch::mse_loss(output.tensor(), target.tensor());
  };
  const std::vector<int64_t> balance{2 * layers - 2 * (layers / 2), 2 * (layers / 2)};

  auto plain = make_model(width, layers);
  auto gpipe_model = make_model(width, layers);
  auto one_f_one_b_model = make_model(width, layers);
  auto zero_bubble_model = make_model(width, layers);
  auto zbv_model = make_model(width, layers);
  auto dualpipev_model = make_model(width, layers);
  namespace gs = gpipe::schedule;
  gs::PipelineSchedule gpipe_pipe(
      gpipe_model, balance, loss,
      gs::PipelineScheduleOptions(chunks).schedule(gs::ScheduleKind::kGPipe).intra_op_threads(1));
  gs::PipelineSchedule one_f_one_b_pipe(one_f_one_b_model, balance, loss,
                                        gs::PipelineScheduleOptions(chunks)
                                            .schedule(gs::ScheduleKind::kOneFOneB)
                                            .intra_op_threads(1));
  gs::PipelineSchedule zero_bubble_pipe(zero_bubble_model, balance, loss,
                                        gs::PipelineScheduleOptions(chunks)
                                            .schedule(gs::ScheduleKind::kZeroBubble)
                                            .intra_op_threads(1));
  const int64_t quarter = 2 * layers / 4;  // modules (Linear and Tanh) per V stage
  const std::vector<int64_t> v_balance{2 * layers - 3 * quarter, quarter, quarter, quarter};
  const auto v_options = [&](gs::ScheduleKind kind) {
    return gs::PipelineScheduleOptions(chunks).schedule(kind).stages_per_worker(2).intra_op_threads(
        1);
  };
  gs::PipelineSchedule zbv_pipe(zbv_model, v_balance, loss,
                                v_options(gs::ScheduleKind::kZeroBubbleV));
  gs::PipelineSchedule dualpipev_pipe(dualpipev_model, v_balance, loss,
                                      v_options(gs::ScheduleKind::kDualPipeV));

  auto plain_step = [&](int threads) {
    set_threads(threads);
    plain->zero_grad();
    torch::mse_loss(plain->forward(input), target).backward();
  };
  // The plain model run micro-batch by micro-batch: what the pipeline's smaller matrix products
  // cost on one thread, without any parallelism.
  const auto microbatches = input.chunk(chunks);
  const auto microtargets = target.chunk(chunks);
  auto chunked_step = [&] {
    set_threads(1);
    plain->zero_grad();
    for (size_t i = 0; i < microbatches.size(); ++i) {
      const double share = static_cast<double>(microbatches[i].size(0)) / batch;
      (torch::mse_loss(plain->forward(microbatches[i]), microtargets[i]) * share).backward();
    }
  };
  std::vector<Candidate> candidates;
  candidates.push_back({"plain, 1 thread (a)", [&] { plain_step(1); }});
  candidates.push_back({"plain, 2 threads (b)", [&] { plain_step(2); }});
  candidates.push_back({"plain, micro-batched, 1 thread", chunked_step});
  const auto pipeline = [&](gs::PipelineSchedule& pipe, torch::nn::Sequential& model) {
    return [&, pipe = &pipe, model = &model] {
      set_threads(1);
      (*model)->zero_grad();
      pipe->step(input, target);
    };
  };
  candidates.push_back({"GPipe, 2 stages x 1 thread", pipeline(gpipe_pipe, gpipe_model), 2});
  candidates.push_back(
      {"1F1B, 2 stages x 1 thread", pipeline(one_f_one_b_pipe, one_f_one_b_model), 2});
  candidates.push_back(
      {"ZB1P, 2 stages x 1 thread", pipeline(zero_bubble_pipe, zero_bubble_model), 2});
  candidates.push_back({"ZBV, 2 x 2 stages x 1 thread", pipeline(zbv_pipe, zbv_model), 4});
  candidates.push_back(
      {"DualPipeV, 2 x 2 stages x 1 thread", pipeline(dualpipev_pipe, dualpipev_model), 4});

  for (auto& c : candidates) c.step();  // warm up, allocate gradients
  for (auto& c : candidates) {
    const int64_t before = gpipe::memory::cpu_current_bytes();
    std::vector<int64_t> stage_before;
    for (int64_t s = 0; s < c.stages; ++s) {
      stage_before.push_back(gpipe::memory::cpu_current_bytes(s));
    }
    gpipe::memory::reset_cpu_peak();
    c.step();
    c.peak = gpipe::memory::cpu_peak_bytes() - before;
    for (int64_t s = 0; s < c.stages; ++s) {
      c.stage_peaks.push_back(gpipe::memory::cpu_peak_bytes(s) - stage_before[s]);
    }
  }
  // Round by round, rotating who goes first: a run must not always follow the same one (BLAS
  // and OpenMP threads of a 2-thread run keep spinning for a while after it, so each run also
  // starts after a pause).
  for (int64_t r = 0; r < repeats; ++r) {
    for (size_t k = 0; k < candidates.size(); ++k) {
      auto& c = candidates[(k + static_cast<size_t>(r)) % candidates.size()];
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let spinning threads park
      c.times.push_back(seconds(c.step, &c.cpu));
    }
  }

  std::printf(
      "model: %lld x (Linear(%lld, %lld) + Tanh), batch %lld, %lld micro-batches, "
      "%lld repeats (medians), OpenBLAS threads %s\n",
      static_cast<long long>(layers), static_cast<long long>(width), static_cast<long long>(width),
      static_cast<long long>(batch), static_cast<long long>(chunks),
      static_cast<long long>(repeats),
      gpipe::bench::blas_threads_settable() ? "set per run" : "not settable");
  const double a = median(candidates[0].times);
  const double b = median(candidates[1].times);
  std::printf("%-35s %10s %10s %12s %8s %8s %14s\n", "", "step (ms)", "cpu (ms)", "samples/s",
              "vs (a)", "vs (b)", "peak memory");
  for (const auto& c : candidates) {
    const double t = median(c.times);
    std::printf("%-35s %10.1f %10.1f %12.1f %7.2fx %7.2fx %11.1f MiB\n", c.name.c_str(), t * 1e3,
                median(c.cpu) * 1e3, batch / t, a / t, b / t, c.peak / 1048576.0);
  }
  std::printf("ZB1P over 1F1B: %.3fx, over GPipe: %.3fx (step time)\n",
              median(candidates[4].times) / median(candidates[5].times),
              median(candidates[3].times) / median(candidates[5].times));
  std::printf("ZBV over 1F1B: %.3fx, over ZB1P: %.3fx (step time)\n",
              median(candidates[4].times) / median(candidates[6].times),
              median(candidates[5].times) / median(candidates[6].times));
  std::printf("DualPipeV over 1F1B: %.3fx, over ZB1P: %.3fx, over ZBV: %.3fx (step time)\n",
              median(candidates[4].times) / median(candidates[7].times),
              median(candidates[5].times) / median(candidates[7].times),
              median(candidates[6].times) / median(candidates[7].times));
  std::printf("peak memory per stage (MiB):");
  for (const auto& c : candidates) {
    if (c.stages == 0) continue;
    std::printf("%s %s", &c == &candidates[3] ? "" : ";",
                c.name.substr(0, c.name.find(',')).c_str());
    for (const int64_t bytes : c.stage_peaks) std::printf(" %.1f", bytes / 1048576.0);
  }
  std::printf("\n(in ZBV and DualPipeV, worker 0 runs stages 0 and 3, worker 1 stages 1 and 2)\n");
  std::printf("bubble bound of GPipe and 1F1B over (a): 2 x %lld / %lld = %.2fx\n",
              static_cast<long long>(chunks), static_cast<long long>(chunks + 1),
              2.0 * chunks / (chunks + 1));
  return 0;
}

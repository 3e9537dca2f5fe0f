// predict() (gpipe/schedule/predict.h) against real steps: every schedule on 2 worker threads (1
// intra-op thread each), the stages' costs taken from a trace of real steps, the predicted step
// time against the measured median, side by side in one run.
//
// Two predictions per schedule: from its own run's trace, and before running it - from the
// trace of another schedule of the same stages (ZB1P's for GPipe, 1F1B and ZB1P, which has every
// kind of compute; ZBV's for the schedules of 2 stages per worker). The measured steps go round by
// round, each schedule in turn, the first one rotating, so a shared machine's drift falls on all
// alike.
//
// Usage: schedule_prediction [--width W] [--layers L] [--batch N] [--chunks M] [--steps R]
// Default: 16 x (Linear(512, 512) + Tanh), batch 2048, 8 micro-batches, 7 measured steps.
#include "common/bench_util.h"

#include "gpipe/cpu_malloc.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/predict.h"
#include "gpipe/schedule/runtime.h"
#include "gpipe/trace.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace gs = gpipe::schedule;

struct Contender {
  std::string name;
  gs::ScheduleKind kind;
  int64_t stages;
  std::string costs_from;  // the contender whose trace predicts this one before it runs
  torch::nn::Sequential model = nullptr;
  std::shared_ptr<gpipe::trace::Tracer> tracer = nullptr;
  std::unique_ptr<gs::PipelineSchedule> pipe = nullptr;
  std::vector<double> seconds = {};
};

}  // namespace

int main(int argc, char** argv) {
  gpipe::memory::reuse_freed_cpu_memory();
  int64_t width = 512, layers = 16, batch = 2048, chunks = 8, steps = 7;
  if (!gpipe::bench::read_int_flags(argc, argv,
                                    {{"--width", &width},
                                     {"--layers", &layers},
                                     {"--batch", &batch},
                                     {"--chunks", &chunks},
                                     {"--steps", &steps}})) {
    return 2;
  }
  at::set_num_threads(1);
  gpipe::bench::set_blas_threads(1);
  const at::Tensor input = torch::randn({batch, width});
  const at::Tensor target = torch::randn({batch, width});
  const gs::LossFunction mse = [](const gpipe::Batch& output, const gpipe::Batch& target) {
    return torch::mse_loss(output.tensor(), target.tensor());
  };

  std::vector<Contender> contenders;
  contenders.push_back({"GPipe", gs::ScheduleKind::kGPipe, 2, "ZB1P"});
  contenders.push_back({"1F1B", gs::ScheduleKind::kOneFOneB, 2, "ZB1P"});
  contenders.push_back({"ZB1P", gs::ScheduleKind::kZeroBubble, 2, "ZB1P"});
  contenders.push_back({"interleaved 1F1B", gs::ScheduleKind::kInterleavedOneFOneB, 4, "ZBV"});
  contenders.push_back({"interleaved ZB1P", gs::ScheduleKind::kInterleavedZeroBubble, 4, "ZBV"});
  contenders.push_back({"looped BFS", gs::ScheduleKind::kLoopedBFS, 4, "ZBV"});
  contenders.push_back({"ZBV", gs::ScheduleKind::kZeroBubbleV, 4, "ZBV"});
  if (chunks >= gs::min_microbatches(gs::ScheduleKind::kDualPipeV, 4)) {
    contenders.push_back({"DualPipeV", gs::ScheduleKind::kDualPipeV, 4, "ZBV"});
  }
  for (auto& c : contenders) {
    torch::manual_seed(0);
    c.model = torch::nn::Sequential();
    for (int64_t k = 0; k < layers; ++k) {
      c.model->push_back(torch::nn::Linear(width, width));
      c.model->push_back(torch::nn::Tanh());
    }
    c.tracer = std::make_shared<gpipe::trace::Tracer>();
    std::vector<int64_t> balance(c.stages, 2 * layers / c.stages);
    balance.back() += 2 * layers - balance.back() * c.stages;
    c.pipe = std::make_unique<gs::PipelineSchedule>(c.model, balance, mse,
                                                    gs::PipelineScheduleOptions(chunks)
                                                        .schedule(c.kind)
                                                        .stages_per_worker(c.stages / 2)
                                                        .intra_op_threads(1)
                                                        .tracer(c.tracer));
  }
  const auto step = [&](Contender& c) {
    c.model->zero_grad();
    const auto start = std::chrono::steady_clock::now();
    c.pipe->step(input, target);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (auto& c : contenders) {
    step(c);  // warm up: allocate gradients, make the schedule
    c.tracer->clear();
  }
  for (int64_t r = 0; r < steps; ++r) {
    for (size_t k = 0; k < contenders.size(); ++k) {
      auto& c = contenders[(k + static_cast<size_t>(r)) % contenders.size()];
      c.seconds.push_back(step(c));
    }
  }

  std::printf(
      "model: %lld x (Linear(%lld, %lld) + Tanh), batch %lld, %lld micro-batches, 2 worker "
      "threads x 1 intra-op thread, %lld steps each (medians)\n",
      static_cast<long long>(layers), static_cast<long long>(width), static_cast<long long>(width),
      static_cast<long long>(batch), static_cast<long long>(chunks), static_cast<long long>(steps));
  std::printf("%-17s %7s %10s %22s %27s %10s\n", "schedule", "stages", "measured",
              "predicted, own trace", "predicted before running", "bubble");
  double worst = 0;
  for (const auto& c : contenders) {
    const gs::Schedule schedule = c.pipe->schedule(chunks);
    const double measured = gpipe::bench::median(c.seconds);
    const gs::Prediction own =
        gs::predict(schedule, gs::costs_from_trace(c.tracer->events(), c.stages));
    const auto& source = *std::find_if(contenders.begin(), contenders.end(),
                                       [&](const Contender& o) { return o.name == c.costs_from; });
    const gs::Prediction before =
        gs::predict(schedule, gs::costs_from_trace(source.tracer->events(), c.stages));
    const auto error = [&](double predicted) { return (predicted - measured) / measured; };
    worst = std::max({worst, std::abs(error(own.step_time)), std::abs(error(before.step_time))});
    std::printf("%-17s %7lld %8.1f ms %8.1f ms (%+5.1f%%) %8.1f ms (%+5.1f%%, %s's) %9.1f%%\n",
                c.name.c_str(), static_cast<long long>(c.stages), measured * 1e3,
                own.step_time * 1e3, 100 * error(own.step_time), before.step_time * 1e3,
                100 * error(before.step_time), source.name.c_str(), 100 * own.bubble_fraction);
  }
  std::printf("largest |predicted - measured| / measured: %.1f%%\n", 100 * worst);
  return 0;
}

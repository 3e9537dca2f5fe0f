#include "train_simulate.h"

#include "arguments.h"
#include "text_corpus.h"

#include <gpipe/balance/balance.h>
#include <gpipe/memory.h>
#include <gpipe/schedule/predict.h>
#include <gpipe/schedule/runtime.h>
#include <gpipe/trace.h>

#include <c10/util/irange.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>

namespace gpipe {
namespace cli {
namespace {

constexpr int64_t kProfiledSteps = 3;

// What profiling measured of one partition into stages.
struct Profile {
  schedule::ActionCosts costs;
  std::vector<double> bytes_per_microbatch;  // per stage: activations held per live micro-batch
};

Profile profile(const torch::nn::Sequential& model, int64_t stages, schedule::ScheduleKind kind,
                int64_t per_worker, const TrainConfig& c, const at::Tensor& input,
                const at::Tensor& target) {
  const auto tracer = std::make_shared<trace::Tracer>();
  schedule::PipelineSchedule pipe(
      model, balance::balance_by_count(stages, static_cast<int64_t>(model->size())),
      [](const Batch& output, const Batch& target) {
        return models::char_gpt_loss(output.tensor(), target.tensor());
      },
      schedule::PipelineScheduleOptions(c.chunks)
          .schedule(kind)
          .stages_per_worker(per_worker)
          .intra_op_threads(c.threads)
          .tracer(tracer));
  pipe.step(input, target);  // warm up: allocators, gradients
  tracer->clear();
  Profile result;
  result.bytes_per_microbatch.assign(stages, 0);
  for (int64_t k = 0; k < kProfiledSteps; ++k) {
    std::vector<int64_t> before(stages);
    for (const auto s : c10::irange(stages)) before[s] = memory::cpu_current_bytes(s);
    memory::reset_cpu_peak();
    pipe.step(input, target);
    for (const auto s : c10::irange(stages)) {
      const double held = static_cast<double>(memory::cpu_peak_bytes(s) - before[s]) /
                          static_cast<double>(std::max<int64_t>(1, pipe.peak_live_microbatches(s)));
      result.bytes_per_microbatch[s] = std::max(result.bytes_per_microbatch[s], held);
    }
  }
  for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  // Workers that outnumber the cores shared them: read each action as if alone, and share them
  // again in predict().
  result.costs = schedule::costs_from_trace(tracer->events(), stages,
                                            schedule::cpu_workers_at_once(c.threads));
  return result;
}

ScheduleForecast forecast(schedule::ScheduleKind kind, int64_t workers, int64_t stages,
                          int64_t microbatches, const Profile& profile) {
  const schedule::Schedule plan = schedule::make_schedule(kind, workers, stages, microbatches);
  const schedule::Prediction p = schedule::predict(plan, profile.costs);
  std::vector<double> worker_bytes(workers, 0);
  for (const auto s : c10::irange(stages)) {
    worker_bytes[plan.worker_of(s)] +=
        static_cast<double>(p.peak_live_microbatches[s]) * profile.bytes_per_microbatch[s];
  }
  ScheduleForecast f;
  f.schedule = c10::str(kind);
  f.stages = stages;
  f.step_seconds = p.step_time;
  f.bubble_fraction = p.bubble_fraction;
  f.peak_worker_bytes =
      static_cast<int64_t>(*std::max_element(worker_bytes.begin(), worker_bytes.end()));
  return f;
}

}  // namespace

SimulateReport simulate_schedules(const TrainConfig& c, std::ostream& out) {
  if (c.ranks) throw UsageError("--simulate predicts worker threads: run it without a launcher");
  memory::install_tracking_cpu_allocator();
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  models::CharGPTOptions options;
  const torch::nn::Sequential model = make_model(c, options);
  const TextCorpus corpus = TextCorpus::load(c.data, options.block_size() + 1);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.seed) + 1);
  const auto [input, target] = corpus.batch(c.batch_size, options.block_size(), generator);
  const int64_t W = c.stages;  // one worker per stage, or per two stages
  const int64_t M = std::min(c.chunks, c.batch_size);
  const bool doubled = 2 * W <= static_cast<int64_t>(model->size());

  using schedule::ScheduleKind;
  SimulateReport report;
  const Profile single = profile(model, W, ScheduleKind::kZeroBubble, 1, c, input, target);
  // One stage per worker, or several (looped stages and the V placement): each kind once.
  const auto several = [](ScheduleKind kind) {
    return schedule::loops_stages(kind) || schedule::placement_of(kind) == schedule::Placement::kV;
  };
  for (const auto kind : schedule::schedule_kinds_where([&](auto k) { return !several(k); })) {
    report.forecasts.push_back(forecast(kind, W, W, M, single));
  }
  if (doubled) {
    const Profile twice = profile(model, 2 * W, ScheduleKind::kZeroBubbleV, 2, c, input, target);
    for (const auto kind : schedule::schedule_kinds_where(several)) {
      const int64_t least = schedule::min_microbatches(kind, 2 * W);
      if (M < least) {
        report.left_out.push_back(c10::str(kind, " (needs at least ", least, " micro-batches)"));
        continue;
      }
      report.forecasts.push_back(forecast(kind, W, 2 * W, M, twice));
    }
  }
  const double budget = c.memory_budget_mib * 1048576.0;
  double best = std::numeric_limits<double>::infinity();
  for (auto& f : report.forecasts) {
    f.fits = budget <= 0 || static_cast<double>(f.peak_worker_bytes) <= budget;
    if (f.fits && f.step_seconds < best) {
      best = f.step_seconds;
      report.fastest = f.schedule;
    }
  }

  out << "gpipe train --simulate: " << W << " worker threads, " << M << " micro-batches, batch "
      << c.batch_size << "; costs of " << kProfiledSteps << " profiled steps of zb1p over " << W
      << " stages" << (doubled ? " and of zbv over " + std::to_string(2 * W) : std::string())
      << " (no checkpointing), " << describe_model(model, options, c.load) << "\n";
  char line[160];
  std::snprintf(line, sizeof(line), "%-18s %7s %16s %8s %26s\n", "schedule", "stages",
                "predicted step", "bubble", "activations, worst worker");
  out << line;
  for (const auto& f : report.forecasts) {
    std::snprintf(line, sizeof(line), "%-18s %7lld %13.1f ms %7.1f%% %22.1f MiB%s\n",
                  f.schedule.c_str(), static_cast<long long>(f.stages), f.step_seconds * 1e3,
                  100 * f.bubble_fraction, static_cast<double>(f.peak_worker_bytes) / 1048576.0,
                  f.fits ? "" : " (over budget)");
    out << line;
  }
  const std::string within =
      c.memory_budget_mib > 0
          ? " within --memory-budget " + std::to_string(c.memory_budget_mib) + " MiB"
          : std::string();
  for (const auto& name : report.left_out) out << "not predicted: " << name << "\n";
  if (report.fastest.empty()) {
    out << "no schedule fits" << within << "\n";
  } else {
    out << "fastest" << within << ": " << report.fastest << "\n";
  }
  return report;
}

}  // namespace cli
}  // namespace gpipe

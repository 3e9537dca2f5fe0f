// gpipe::plan (gpipe/plan.h) against a measured sweep. Every family the planner finds to fit
// its cap - schedule kind x stages per worker x micro-batches x checkpoint mode, each with the
// balance the planner chose for it - is trained on worker threads (1 intra-op thread each),
// round by round, the first one rotating, so that a shared machine's drift falls on all alike.
// Reported: the plan's choice against the sweep's fastest configuration that fits the cap, and
// for each configuration the predicted step time and peak memory per worker against measured.
//
// Memory per worker, measured: its layers' weights and gradients (what param_scale 2 counts)
// plus the highest bytes the worker's thread allocated in a step above what it held before (the
// tracking allocator's tag per worker, gpipe/memory.h).
//
// On ranks: run under a launcher (`gpipe launch -n 2 -- plan_sweep ...`, torchrun), one worker
// per rank (--workers is the world size). Rank 0 plans, as `gpipe train --plan` does, on worker
// threads of its own process; every rank then trains each configuration through a
// distributed::PipelineStage over Gloo. A step's time is the slowest rank's, from a barrier; a
// rank's memory is its process's allocations above what it held before the step (a receive
// posted in the step before for this one is left out). Only rank 0 prints and writes the report;
// the predictions from the actions' own durations are left out (each rank traces its own).
//
// --cap tight: the cap is 80% of what the leanest 1F1B without checkpointing needs, so that the
// planner must checkpoint or choose a schedule that holds less (V-Min, V-Half).
#include "common/bench_util.h"
#include "common/speed.h"
#include "plan-sweep/ranks.h"

#include "gpipe/cpu_malloc.h"
#include "gpipe/distributed/pipeline_stage.h"
#include "gpipe/memory.h"
#include "gpipe/plan.h"
#include "gpipe/schedule/predict.h"
#include "gpipe/schedule/runtime.h"
#include "gpipe/trace.h"
#include "models/char_gpt.h"
#include "models/resnet.h"
#include "models/unet.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

namespace bench = gpipe::bench;
namespace gs = gpipe::schedule;

struct Workload {
  std::string name;
  torch::nn::Sequential model;
  at::Tensor input;
  at::Tensor target;
  gs::LossFunction loss;
};

Workload make_workload(const std::string& model, int64_t batch) {
  torch::manual_seed(0);
  if (model == "gpt") {
    const gpipe::models::CharGPTOptions options;  // `gpipe train`'s default model
    const at::Tensor tokens =
        torch::randint(options.vocab_size(), {batch, options.block_size() + 1}, torch::kLong);
    return {"char GPT (gpipe train's default), batch " + std::to_string(batch),
            gpipe::models::char_gpt(options),
            tokens.narrow(1, 0, options.block_size()).contiguous(),
            tokens.narrow(1, 1, options.block_size()).contiguous(),
            [](const gpipe::Batch& output, const gpipe::Batch& target) {
              return gpipe::models::char_gpt_loss(output.tensor(), target.tensor());
            }};
  }
  if (model == "resnet101") {
    return {"ResNet-101, width 16, batch " + std::to_string(batch) + " x 32 x 32",
            gpipe::models::resnet(
                gpipe::models::ResNetOptions({3, 4, 23, 3}).base_width(16).num_classes(10)),
            torch::randn({batch, 3, 32, 32}), torch::randint(10, {batch}, torch::kLong),
            [](const gpipe::Batch& output, const gpipe::Batch& target) {
              return bench::cross_entropy(output.tensor(), target.tensor());
            }};
  }
  if (model == "unet") {
    return {
        "U-Net (depth 3, 2 convolutions, base 8), batch " + std::to_string(batch) + " x 64 x 64",
        gpipe::models::unet(
            gpipe::models::UNetOptions().depth(3).num_convs(2).base_channels(8).dropout(0)),
        torch::randn({batch, 3, 64, 64}), (torch::rand({batch, 1, 64, 64}) > 0.5).to(torch::kFloat),
        [](const gpipe::Batch& output, const gpipe::Batch& target) {
          return bench::binary_cross_entropy(output.tensor(), target.tensor());
        }};
  }
  std::fprintf(stderr, "plan_sweep: unknown --model %s (gpt, resnet101, unet)\n", model.c_str());
  std::exit(2);
}

// One configuration of the sweep: a plan and what its steps measured.
struct Run {
  gpipe::Plan plan;
  std::shared_ptr<gpipe::trace::Tracer> tracer = std::make_shared<gpipe::trace::Tracer>();
  std::unique_ptr<gs::PipelineSchedule> pipe;                // on threads
  std::unique_ptr<gpipe::distributed::PipelineStage> stage;  // on ranks
  std::vector<double> seconds;
  std::vector<int64_t> peak_bytes;  // per worker, measured
};

int64_t parameter_bytes(const torch::nn::Module& layer) {
  int64_t bytes = 0;
  for (const auto& p : layer.parameters()) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}

// Weights and gradients of each worker's layers under `plan`.
std::vector<int64_t> parameter_bytes_per_worker(const torch::nn::Sequential& model,
                                                const gpipe::Plan& plan, int64_t workers) {
  std::vector<int64_t> bytes(workers, 0);
  const gs::Placement placement = gs::placement_of(plan.schedule);
  int64_t layer = 0;
  for (size_t s = 0; s < plan.balance.size(); ++s) {
    const int64_t w = gs::worker_of(placement, static_cast<int64_t>(s), workers);
    for (int64_t k = 0; k < plan.balance[s]; ++k) {
      bytes[w] += 2 * parameter_bytes(*model->ptr(static_cast<size_t>(layer++)));
    }
  }
  return bytes;
}

// One step's peak per worker: gradients kept (zeroed, not freed), so that only the step's own
// allocations - activations, messages, recomputation - count above the parameters.
std::vector<int64_t> measure_peak_bytes(Run& run, const Workload& w, int64_t workers,
                                        gpipe::bench::Ranks* ranks) {
  for (auto& p : w.model->parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  if (ranks) {
    const int64_t before = gpipe::memory::cpu_current_bytes();
    gpipe::memory::reset_cpu_peak();
    run.stage->step(w.input, w.target);
    return ranks->gather(parameter_bytes_per_worker(w.model, run.plan, workers)[ranks->rank()] +
                         gpipe::memory::cpu_peak_bytes() - before);
  }
  std::vector<int64_t> before(workers);
  for (int64_t k = 0; k < workers; ++k) before[k] = gpipe::memory::cpu_worker_current_bytes(k);
  gpipe::memory::reset_cpu_peak();
  run.pipe->step(w.input, w.target);
  std::vector<int64_t> peak = parameter_bytes_per_worker(w.model, run.plan, workers);
  for (int64_t k = 0; k < workers; ++k) {
    peak[k] += gpipe::memory::cpu_worker_peak_bytes(k) - before[k];
  }
  return peak;
}

double relative_error(double predicted, double measured) {
  return (predicted - measured) / measured;
}

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof(text), "%+.1f%%", 100 * fraction);
  return text;
}

std::string balance_text(const std::vector<int64_t>& balance) {
  std::string text;
  for (const int64_t b : balance) text += (text.empty() ? "" : ",") + std::to_string(b);
  return text;
}

// The bytes the leanest 1F1B without checkpointing needs on its fullest worker: in the report's
// plans where one fits, else in its rejections.
int64_t leanest_one_f_one_b(const gpipe::PlanReport& report) {
  int64_t leanest = 0;
  const auto consider = [&](int64_t bytes) {
    if (bytes > 0 && (leanest == 0 || bytes < leanest)) leanest = bytes;
  };
  for (const auto& p : report.plans) {
    if (p.schedule == gs::ScheduleKind::kOneFOneB &&
        p.checkpoint == gpipe::CheckpointMode::kNever) {
      consider(p.largest_peak_bytes());
    }
  }
  for (const auto& r : report.rejected) {
    if (r.family.rfind("1f1b,", 0) == 0 && r.family.find("never") != std::string::npos) {
      consider(r.peak_bytes);
    }
  }
  return leanest;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "gpt", workers_flag = "2", batch_flag = "32", cap_flag = "none",
              loss_flag = "model";
  const auto args = bench::parse_args(
      argc, argv, "plan-sweep",
      "gpipe::plan's choice and predictions against a measured sweep of every family it finds\n"
      "to fit: each configuration trained on worker threads, round by round, side by side.",
      5,
      {{"--model", &model, "gpt (the char GPT of gpipe train), resnet101 or unet"},
       {"--workers", &workers_flag,
        "worker threads, one intra-op thread each (under a launcher: one per rank)"},
       {"--batch", &batch_flag, "samples per step"},
       {"--cap", &cap_flag,
        "none, tight (80% of the leanest 1F1B without checkpointing) or MiB per worker"},
       {"--plan-loss", &loss_flag,
        "model (plan with the loss the sweep trains with) or none (plan without a loss)"}});
  const int64_t batch = std::stoll(batch_flag);
  gpipe::memory::reuse_freed_cpu_memory();  // as gpipe train does (gpipe/cpu_malloc.h)
  at::set_num_threads(1);
  bench::set_blas_threads(1);
  gpipe::memory::install_tracking_cpu_allocator();
  std::unique_ptr<bench::Ranks> ranks;
  if (std::getenv("WORLD_SIZE")) {
    ranks = std::make_unique<bench::Ranks>();
    // Only rank 0 reports.
    if (ranks->rank() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;
  }
  const int64_t workers = ranks ? ranks->size() : std::stoll(workers_flag);
  Workload w = make_workload(model, batch);

  TORCH_CHECK_VALUE(loss_flag == "model" || loss_flag == "none",
                    "--plan-loss must be model or none, not ", loss_flag);
  const auto plan = [&](const gpipe::PlanOptions& options) {
    return loss_flag == "none" ? gpipe::plan(w.model, gpipe::Batch(w.input), options)
                               : gpipe::plan(w.model, gpipe::Batch(w.input), gpipe::Batch(w.target),
                                             w.loss, options);
  };
  gpipe::PlanReport report;
  double planning_seconds = 0;
  int64_t cap = 0;
  // Rank 0 plans for every rank.
  const auto plan_here = [&] {
    gpipe::PlanOptions options(workers);
    options.param_scale(2.0);  // weights and gradients: what measure_peak_bytes counts
    options.ranks(ranks != nullptr);
    if (cap_flag == "tight") {
      // Plan once without a cap to find what 1F1B needs at its leanest.
      const gpipe::PlanReport free = plan(options);
      planning_seconds += free.profile_seconds + free.search_seconds;
      cap = static_cast<int64_t>(0.8 * static_cast<double>(leanest_one_f_one_b(free)));
    } else if (cap_flag != "none") {
      cap = static_cast<int64_t>(std::stod(cap_flag) * (1 << 20));
    }
    options.memory_cap(cap);
    report = plan(options);
    planning_seconds += report.profile_seconds + report.search_seconds;
    std::printf("%s, %lld %s x 1 intra-op thread%s\n", w.name.c_str(),
                static_cast<long long>(workers),
                ranks ? "ranks (planned as worker threads of rank 0)" : "worker threads",
                cap ? (", cap " + bench::fixed(bench::mib(cap), 1) + " MiB a worker").c_str() : "");
    std::printf(
        "planned %s in %.2f s (profile %.2f s, search %.3f s): %zu plans fit, %zu ruled out\n",
        loss_flag == "none" ? "without the loss" : "with the loss", planning_seconds,
        report.profile_seconds, report.search_seconds, report.plans.size(), report.rejected.size());
    for (const auto& c : report.calibration) {
      std::printf("calibrated at %lld micro-batches: forward x%.2f, backward x%.2f\n",
                  static_cast<long long>(c.microbatches), c.forward, c.backward);
    }
    if (report.cores > 0) {
      std::printf("predicted on %lld cores shared by the workers\n",
                  static_cast<long long>(report.cores));
    }
    return report.plans;
  };
  const std::vector<gpipe::Plan> plans = ranks ? ranks->share(plan_here) : plan_here();
  if (ranks) cap = ranks->gather(cap)[0];
  if (plans.empty()) {
    std::printf("no plan fits\n");
    return 1;
  }

  std::vector<Run> runs;
  for (const auto& p : plans) {
    Run run{p};
    if (ranks) {
      // Every rank builds them in the same order. Dozens of transports look for failures in the
      // store: each once a second rather than 20 times, to leave the cores to the steps.
      run.stage = std::make_unique<gpipe::distributed::PipelineStage>(
          ranks->group(), w.model, p.balance, w.loss,
          gpipe::distributed::PipelineStageOptions(p.microbatches)
              .schedule(p.schedule)
              .stages_per_worker(p.stages_per_worker)
              .checkpoint(p.checkpoint)
              .device(torch::kCPU)
              .poll_interval(std::chrono::seconds(1)));
    } else {
      run.pipe = std::make_unique<gs::PipelineSchedule>(w.model, p.balance, w.loss,
                                                        gs::PipelineScheduleOptions(p.microbatches)
                                                            .schedule(p.schedule)
                                                            .stages_per_worker(p.stages_per_worker)
                                                            .checkpoint(p.checkpoint)
                                                            .intra_op_threads(1)
                                                            .tracer(run.tracer));
    }
    runs.push_back(std::move(run));
  }
  const auto step = [&](Run& run) {
    w.model->zero_grad();
    if (ranks) ranks->barrier();
    const auto start = std::chrono::steady_clock::now();
    if (ranks) {
      run.stage->step(w.input, w.target);
    } else {
      run.pipe->step(w.input, w.target);
    }
    return bench::seconds_since(start);
  };
  // Each contender's step times over `rounds` rounds, one step each a round, the first one
  // rotating, so that a shared machine's drift falls on all alike.
  const auto side_by_side = [&](const std::vector<Run*>& contenders, int rounds) {
    std::vector<std::vector<double>> seconds(contenders.size());
    for (int r = 0; r < rounds; ++r) {
      for (size_t k = 0; k < contenders.size(); ++k) {
        const size_t c = (k + static_cast<size_t>(r)) % contenders.size();
        seconds[c].push_back(step(*contenders[c]));
      }
    }
    if (ranks) {
      for (auto& s : seconds) s = ranks->max(s);  // each step as long as its slowest rank's
    }
    return seconds;
  };
  std::vector<Run*> all;
  for (auto& run : runs) {
    step(run);  // warm up: the schedule, the gradients
    run.peak_bytes = measure_peak_bytes(run, w, workers, ranks.get());
    run.tracer->clear();
    all.push_back(&run);
  }
  const std::vector<std::vector<double>> seconds = side_by_side(all, args.rounds);
  for (size_t k = 0; k < runs.size(); ++k) runs[k].seconds = seconds[k];

  // The sweep's fastest configuration whose measured peak fits the cap.
  const auto fits = [&](const Run& run) {
    return cap == 0 || *std::max_element(run.peak_bytes.begin(), run.peak_bytes.end()) <= cap;
  };
  const Run* fastest = nullptr;
  for (const auto& run : runs) {
    if (fits(run) && (!fastest || bench::median(run.seconds) < bench::median(fastest->seconds))) {
      fastest = &run;
    }
  }
  // The fastest of many noisy medians is faster than its configuration is (the winner's
  // curse), so the choice is judged again: it and the five fastest that fit, each measured
  // anew for twice the rounds, side by side.
  std::vector<Run*> finalists;
  for (auto& run : runs) {
    if (fits(run)) finalists.push_back(&run);
  }
  std::sort(finalists.begin(), finalists.end(), [](const Run* a, const Run* b) {
    return bench::median(a->seconds) < bench::median(b->seconds);
  });
  if (finalists.size() > 5) finalists.resize(5);
  const size_t fastest_five = finalists.size();
  if (std::find(finalists.begin(), finalists.end(), &runs.front()) == finalists.end()) {
    finalists.push_back(&runs.front());
  }
  const std::vector<std::vector<double>> again = side_by_side(finalists, 2 * args.rounds);
  size_t chosen_again = 0, fastest_again = 0;
  for (size_t f = 0; f < finalists.size(); ++f) {
    if (finalists[f] == &runs.front()) chosen_again = f;
    if (bench::median(again[f]) < bench::median(again[fastest_again])) fastest_again = f;
  }
  const double rematch = bench::median(again[chosen_again]) / bench::median(again[fastest_again]);

  if (ranks && ranks->rank() != 0) return 0;  // the others know rank 0's plans by family only
  bench::Table table({"#", "schedule", "stages", "micro", "checkpoint", "balance", "predicted ms",
                      "measured ms (min med max)", "error", "from trace", "predicted MiB",
                      "measured MiB", "error"});
  nlohmann::json rows = nlohmann::json::array();
  double worst_top_time = 0, worst_top_memory = 0;
  int over_cap = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    const Run& run = runs[k];
    const gpipe::Plan& p = run.plan;
    const double measured = bench::median(run.seconds);
    const double time_error = relative_error(p.step_seconds, measured);
    // The same schedule predicted from the actions' durations in its own steps: what is left
    // between this and the measured step is the simulation's; the rest is the profile's.
    const double from_trace =
        ranks ? std::nan("")
              : gs::predict(
                    run.pipe->schedule(p.microbatches),
                    gs::costs_from_trace(run.tracer->events(),
                                         static_cast<int64_t>(p.balance.size()), report.cores))
                    .step_time;
    // Memory: the worker whose prediction is furthest off.
    double memory_error = 0;
    for (size_t v = 0; v < run.peak_bytes.size(); ++v) {
      const double e = relative_error(static_cast<double>(p.peak_bytes[v]),
                                      static_cast<double>(run.peak_bytes[v]));
      if (std::abs(e) > std::abs(memory_error)) memory_error = e;
    }
    const int64_t measured_peak = *std::max_element(run.peak_bytes.begin(), run.peak_bytes.end());
    if (!fits(run)) ++over_cap;
    if (k < 5) {
      worst_top_time = std::max(worst_top_time, std::abs(time_error));
      worst_top_memory = std::max(worst_top_memory, std::abs(memory_error));
    }
    const auto [low, high] = std::minmax_element(run.seconds.begin(), run.seconds.end());
    table.add({std::to_string(k + 1) + (&run == fastest ? " *" : ""), c10::str(p.schedule),
               std::to_string(p.stages_per_worker * workers), std::to_string(p.microbatches),
               bench::describe(p.checkpoint), balance_text(p.balance),
               bench::fixed(p.step_seconds * 1e3, 1),
               bench::fixed(*low * 1e3, 1) + " " + bench::fixed(measured * 1e3, 1) + " " +
                   bench::fixed(*high * 1e3, 1),
               percent(time_error), ranks ? "-" : percent(relative_error(from_trace, measured)),
               bench::fixed(bench::mib(p.largest_peak_bytes()), 1),
               bench::fixed(bench::mib(measured_peak), 1) + (fits(run) ? "" : " (over)"),
               percent(memory_error)});
    rows.push_back(
        {{"family", p.family()},
         {"balance", p.balance},
         {"predicted_ms", p.step_seconds * 1e3},
         {"measured_ms", measured * 1e3},
         {"measured_ms_min", *low * 1e3},
         {"measured_ms_max", *high * 1e3},
         {"predicted_from_trace_ms", ranks ? nlohmann::json() : nlohmann::json(from_trace * 1e3)},
         {"predicted_peak_bytes", p.peak_bytes},
         {"measured_peak_bytes", run.peak_bytes}});
  }
  table.print();
  const double chosen = bench::median(runs.front().seconds);
  std::printf(
      "\n%zu configurations measured, %d steps each (medians); * = the sweep's fastest "
      "that fits%s\n",
      runs.size(), args.rounds, cap ? " the cap" : "");
  if (fastest) {
    std::printf("choice (#1) / the sweep's fastest: %.1f / %.1f ms = %.3f (target <= 1.05)\n",
                chosen * 1e3, bench::median(fastest->seconds) * 1e3,
                chosen / bench::median(fastest->seconds));
  }
  std::printf(
      "measured again, %d steps each, the choice side by side with the %zu fastest: "
      "choice / fastest = %.3f (fastest: %s)\n",
      2 * args.rounds, fastest_five, rematch, finalists[fastest_again]->plan.family().c_str());
  std::printf(
      "top 5, largest |predicted - measured| / measured: step %.1f%%, peak memory %.1f%% "
      "(target <= 10%%)\n",
      100 * worst_top_time, 100 * worst_top_memory);
  if (cap) {
    std::printf("cap %.1f MiB: %zu of %zu measured under it\n", bench::mib(cap),
                runs.size() - static_cast<size_t>(over_cap), runs.size());
  }
  bench::write_json(
      args, {{"model", w.name},
             {"workers", workers},
             {"engine", ranks ? "ranks" : "threads"},
             {"cap_bytes", cap},
             {"rounds", args.rounds},
             {"planning_seconds", planning_seconds},
             {"profile_seconds", report.profile_seconds},
             {"search_seconds", report.search_seconds},
             {"cores", report.cores},
             {"choice_over_fastest", fastest ? chosen / bench::median(fastest->seconds) : 0.0},
             {"choice_over_fastest_measured_again", rematch},
             {"top5_step_error", worst_top_time},
             {"top5_memory_error", worst_top_memory},
             {"over_cap", over_cap},
             {"configurations", rows}});
  return 0;
}

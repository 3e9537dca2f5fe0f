#include "gpipe/plan.h"

#include "distributed/c10d_transport_edge.h"
#include "gpipe/balance/block_partition.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/predict.h"
#include "plan/calibration.h"
#include "plan/layer_costs.h"
#include "plan/stage_memory.h"
#include "schedule/receive_window.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

namespace gpipe {
namespace {

using schedule::ScheduleKind;
using LayerCosts = plan_detail::LayerCosts;
using ModelCosts = plan_detail::ModelCosts;
using Clock = std::chrono::steady_clock;

constexpr int kRowsShown = 12;
constexpr const char* kFitsWithout = "it fits without checkpointing, and recomputing adds time";

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return text;
}

void check(const PlanOptions& options, int64_t batch_size) {
  TORCH_CHECK_VALUE(options.workers() >= 1,
                    "workers must be positive (workers: ", options.workers(), ")");
  TORCH_CHECK_VALUE(options.memory_cap() >= 0,
                    "memory_cap must not be negative (memory_cap: ", options.memory_cap(), ")");
  TORCH_CHECK_VALUE(!options.schedules().empty(), "schedules is empty: name at least one");
  for (const int64_t m : options.microbatches()) {
    TORCH_CHECK_VALUE(m >= 1 && m <= batch_size, "a micro-batch count must be in [1, ", batch_size,
                      "], the batch size (microbatches: ", m, ")");
  }
  for (const int64_t v : options.looped_stages_per_worker()) {
    TORCH_CHECK_VALUE(v >= 1, "looped_stages_per_worker must be positive (", v, ")");
  }
  TORCH_CHECK_VALUE(options.param_scale() >= 0,
                    "param_scale must not be negative (param_scale: ", options.param_scale(), ")");
  TORCH_CHECK_VALUE(options.latency() >= 0 && options.seconds_per_byte() >= 0,
                    "the link must not be negative (latency: ", options.latency(),
                    ", seconds_per_byte: ", options.seconds_per_byte(), ")");
  TORCH_CHECK_VALUE(options.receive_window() >= 0, "receive_window must not be negative ",
                    "(receive_window: ", options.receive_window(), ")");
  TORCH_CHECK_VALUE(options.cores() >= 0, "cores must not be negative (cores: ", options.cores(),
                    ")");
  TORCH_CHECK_VALUE(options.intra_op_threads() >= 1, "intra_op_threads must be positive ",
                    "(intra_op_threads: ", options.intra_op_threads(), ")");
  TORCH_CHECK_VALUE(options.repetitions() >= 1,
                    "repetitions must be positive (repetitions: ", options.repetitions(), ")");
}

std::vector<int64_t> microbatch_counts(const PlanOptions& options, int64_t batch_size) {
  if (!options.microbatches().empty()) return options.microbatches();
  std::vector<int64_t> counts;
  int64_t m = 1;
  while (m < options.workers()) m *= 2;
  for (; m <= 8 * options.workers() && m <= batch_size; m *= 2) counts.push_back(m);
  if (counts.empty()) counts.push_back(batch_size);  // fewer samples than workers
  return counts;
}

// "1f1b, 1 stage per worker, 8 micro-batches": a family before its checkpoint mode.
std::string shape_name(ScheduleKind kind, int64_t stages_per_worker, int64_t microbatches) {
  return c10::str(kind, ", ", stages_per_worker, " stage", stages_per_worker == 1 ? "" : "s",
                  " per worker, ", microbatches, " micro-batches");
}

// One family - schedule kind, stages per worker, micro-batches, checkpoint mode - with its
// schedule and its layers' and loss's costs, evaluated for any balance.
class Family {
 public:
  Family(Plan shape, schedule::Schedule schedule, const ModelCosts& costs,
         const PlanOptions& options)
      : shape_(std::move(shape)),
        schedule_(std::move(schedule)),
        timeline_(schedule::simulate(schedule_)),
        layers_(costs.layers),
        loss_(costs.loss),
        tied_(costs.tied),
        options_(options),
        receive_window_(!options.ranks() ? 0  // no receives to post
                        : options.receive_window() > 0
                            ? options.receive_window()
                            : schedule::detail::automatic_receive_window(schedule_)) {}

  // The plan for `balance`: predicted step, bubble, and each worker's peak bytes.
  Plan evaluate(const std::vector<int64_t>& balance) const {
    const int64_t S = schedule_.num_stages;
    schedule::ActionCosts costs;
    costs.latency = options_.latency();
    costs.seconds_per_byte = options_.seconds_per_byte();
    costs.cores = options_.cores();
    if (options_.ranks()) costs.receive_window = receive_window_;
    std::vector<int64_t> first(S + 1, 0);  // stage s holds layers [first[s], first[s + 1])
    for (const auto s : c10::irange(S)) first[s + 1] = first[s] + balance[s];
    const double recomputed = shape_.checkpoint == CheckpointMode::kAlways ? 1.0
                              : shape_.checkpoint == CheckpointMode::kExceptLast
                                  ? static_cast<double>(shape_.microbatches - 1) /
                                        static_cast<double>(shape_.microbatches)
                                  : 0.0;
    for (const auto s : c10::irange(S)) {
      double forward = 0, whole = 0, input = 0, weight = 0;
      for (int64_t k = first[s]; k < first[s + 1]; ++k) {
        forward += layers_[k].forward;
        whole += layers_[k].backward;
        input += layers_[k].backward_input;
        weight += layers_[k].backward_weight;
      }
      const double recomputing = recomputed * forward;  // the layers again, not the loss
      const bool last = s + 1 == S;
      if (last) {  // the last stage's forward runs the loss; its backward starts there
        forward += loss_.forward;
        whole += loss_.backward;
        input += loss_.backward_input;
      }
      costs.forward.push_back(forward);
      costs.backward_input.push_back(input + recomputing);
      costs.backward_weight.push_back(weight);
      costs.backward.push_back(whole + recomputing);
      costs.message_bytes.push_back(last ? 0 : layers_[first[s + 1]].input_bytes);
    }
    const schedule::Prediction prediction = schedule::predict(schedule_, costs, timeline_);

    Plan plan = shape_;
    plan.balance = balance;
    plan.step_seconds = prediction.step_time;
    plan.bubble_fraction = prediction.bubble_fraction;
    plan.peak_bytes.assign(schedule_.num_workers, 0);
    std::vector<plan_detail::StageMemory> stages;
    const bool split = schedule::splits_backward(shape_.schedule);
    for (const auto s : c10::irange(S)) {
      const auto elsewhere = [&](int64_t t) {
        return schedule_.worker_of(t) != schedule_.worker_of(s);
      };
      stages.push_back(plan_detail::stage_memory(layers_, loss_, first, s, options_.param_scale()));
      stages.back().upstream_crosses = s > 0 && elsewhere(s - 1);
      stages.back().downstream_crosses = split && s + 1 < S && elsewhere(s + 1);
      stages.back().input_from_rank = options_.ranks() && s > 0 && elsewhere(s - 1);
      stages.back().output_to_rank = options_.ranks() && s + 1 < S && elsewhere(s + 1);
      stages.back().receive_window = receive_window_;
      stages.back().message_header = distributed::kHeaderBytes;
      stages.back().one_message_bytes = distributed::kMaxOneMessageBytes;
    }
    std::vector<int64_t> worker_of_layer;  // between ranks, for the ties across them
    for (const auto s : c10::irange(options_.ranks() ? S : 0)) {
      worker_of_layer.insert(worker_of_layer.end(), balance[s], schedule_.worker_of(s));
    }
    // A worker's stages hold at once what each holds at that moment of the schedule.
    for (const auto w : c10::irange(schedule_.num_workers)) {
      std::vector<int64_t> mine;
      for (const auto s : c10::irange(S)) {
        if (schedule_.worker_of(s) == w) mine.push_back(s);
      }
      int64_t most = 0;
      for (const auto& moment : prediction.held_microbatches[w]) {
        // The worker's stages send their gradients one after another: one may lag.
        int64_t held = 0, lagging = 0;
        for (const auto j : c10::irange(mine.size())) {
          held += stages[mine[j]].held(moment[j], shape_.checkpoint);
          lagging = std::max(lagging, stages[mine[j]].lagging(moment[j]));
        }
        most = std::max(most, held + lagging);
      }
      for (const int64_t s : mine) most += stages[s].fixed;
      if (options_.ranks()) {
        most += plan_detail::tied_bytes_between_ranks(tied_, worker_of_layer, w);
      }
      plan.peak_bytes[w] = most;
    }
    return plan;
  }

  // How far over the cap `plan` is, 0 within it.
  int64_t excess(const Plan& plan) const {
    if (options_.memory_cap() == 0) return 0;
    return std::max<int64_t>(0, plan.largest_peak_bytes() - options_.memory_cap());
  }

  // Better: within the cap before over it, then faster; over the cap, less over.
  bool better(const Plan& a, const Plan& b) const {
    const int64_t over_a = excess(a), over_b = excess(b);
    if (over_a != over_b) return over_a < over_b;
    return a.step_seconds < b.step_seconds;
  }

  // From each start, moves one layer across one cut at a time while that makes a better plan.
  Plan search() const {
    const int64_t S = schedule_.num_stages;
    std::vector<int64_t> time, size;
    for (const auto& layer : layers_) {
      time.push_back(static_cast<int64_t>(1e9 * (layer.forward + layer.backward)));
      size.push_back(layer.activation_bytes + layer.parameter_bytes);
    }
    std::optional<Plan> best;
    for (const auto& start :
         {balance::block_partition(time, S), balance::block_partition(size, S)}) {
      Plan current = evaluate(start);
      for (bool moved = true; moved;) {
        moved = false;
        for (int64_t cut = 0; cut + 1 < S; ++cut) {
          for (const int64_t shift : {-1, 1}) {  // -1: stage `cut` gives its last layer on
            std::vector<int64_t> balance = current.balance;
            balance[cut] += shift;
            balance[cut + 1] -= shift;
            if (balance[cut] < 1 || balance[cut + 1] < 1) continue;
            Plan candidate = evaluate(balance);
            if (better(candidate, current)) current = std::move(candidate), moved = true;
          }
        }
      }
      if (!best || better(current, *best)) best = std::move(current);
    }
    return *best;
  }

 private:
  Plan shape_;
  schedule::Schedule schedule_;
  schedule::Timeline timeline_;  // its simulation, made once for every balance
  const std::vector<LayerCosts>& layers_;
  const LayerCosts& loss_;
  const std::vector<plan_detail::TiedParameter>& tied_;
  const PlanOptions& options_;
  const int64_t receive_window_;  // between ranks: receives posted ahead per edge
};

}  // namespace

int64_t Plan::largest_peak_bytes() const {
  return peak_bytes.empty() ? 0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
}

std::string Plan::family() const {
  return c10::str(shape_name(schedule, stages_per_worker, microbatches), ", checkpoint ",
                  checkpoint);
}

const Plan& PlanReport::best() const {
  if (!plans.empty()) return plans.front();
  std::ostringstream reasons;
  for (const auto& r : rejected) reasons << "\n  " << r.family << ": " << r.reason;
  TORCH_CHECK_VALUE(false, "no plan fits:", reasons.str());
}

namespace {

// plan(), with the loss and target where the caller gave them.
PlanReport plan_with(torch::nn::Sequential model, const Batch& sample, const Batch* target,
                     const schedule::LossFunction* loss, const PlanOptions& options) {
  TORCH_CHECK_VALUE(sample.size() > 0, "the sample has no tensor");
  const int64_t batch_size = sample[0].size(0);
  check(options, batch_size);
  TORCH_CHECK_VALUE(!model->is_empty(), "the model has no layers to plan");
  if (target != nullptr) {
    TORCH_CHECK_VALUE(static_cast<bool>(*loss), "the loss function is empty");
    for (const auto& t : target->tensors()) {
      TORCH_CHECK_VALUE(!t.defined() || (t.dim() > 0 && t.size(0) == batch_size),
                        "the target's batch size must be the sample's (", batch_size,
                        "), but a target tensor has shape ", t.sizes());
    }
  }
  const int64_t W = options.workers(), L = static_cast<int64_t>(model->size());
  PlanReport report;
  const int64_t cores = options.cores() > 0 ? options.cores()
                        : sample[0].device().is_cpu()
                            ? schedule::cpu_workers_at_once(options.intra_op_threads())
                            : 0;
  report.cores = cores < W ? cores : 0;  // with a core each, nothing is shared
  PlanOptions resolved = options;
  resolved.cores(report.cores);

  // Profile once per micro-batch size (the first micro-batch's: the largest).
  auto begun = Clock::now();
  std::map<int64_t, ModelCosts> costs;  // micro-batches -> each layer's and the loss's costs
  const std::vector<plan_detail::TiedParameter> tied = plan_detail::tied_parameters(model);
  for (const int64_t m : microbatch_counts(options, batch_size)) {
    ModelCosts& model_costs = costs[m];
    model_costs.tied = tied;
    const Batch microbatch = scatter(sample, m)[0];
    Batch output{at::Tensor()};
    model_costs.layers =
        plan_detail::profile_layer_costs(model, microbatch, options.repetitions(), &output);
    if (loss != nullptr) {
      // A mean over the mini-batch scales each micro-batch's loss by its share.
      const double share =
          static_cast<double>(microbatch[0].size(0)) / static_cast<double>(batch_size);
      model_costs.loss = plan_detail::profile_loss_costs(output, scatter(*target, m)[0], *loss,
                                                         share, options.repetitions());
    } else {
      // Half the squares, free: the backward starts from the output as its own gradient.
      model_costs.loss.backward_transient_bytes = model_costs.layers.back().output_bytes;
    }
  }
  if (options.calibrate() && sample[0].device().is_cpu()) {
    report.calibration = plan_detail::calibrate(
        model, sample, target != nullptr ? *target : sample,
        loss != nullptr ? *loss : schedule::LossFunction(plan_detail::half_squares), W,
        options.intra_op_threads(), report.cores, costs, options.repetitions());
    for (const auto& calibration : report.calibration) {
      plan_detail::apply(calibration, costs[calibration.microbatches]);
    }
  }
  report.profile_seconds = std::chrono::duration<double>(Clock::now() - begun).count();

  begun = Clock::now();
  for (const ScheduleKind kind : options.schedules()) {
    std::vector<int64_t> per_worker{1};
    if (schedule::placement_of(kind) == schedule::Placement::kV) per_worker = {2};
    if (schedule::loops_stages(kind)) per_worker = options.looped_stages_per_worker();
    std::vector<CheckpointMode> modes{CheckpointMode::kNever};
    if (!schedule::splits_backward(kind)) {
      modes.push_back(CheckpointMode::kExceptLast);
      modes.push_back(CheckpointMode::kAlways);
    }
    for (const int64_t v : per_worker) {
      const int64_t S = v * W;
      for (const auto& [m, model_costs] : costs) {
        Plan family_plan;
        family_plan.schedule = kind;
        family_plan.stages_per_worker = v;
        family_plan.microbatches = m;
        const std::string shape = shape_name(kind, v, m);
        if (S > L) {
          report.rejected.push_back(
              {shape, c10::str("more stages (", S, ") than layers (", L, ")")});
          continue;
        }
        const int64_t least = schedule::min_microbatches(kind, S);
        if (m < least) {
          report.rejected.push_back(
              {shape, c10::str("too few micro-batches: needs at least ", least)});
          continue;
        }
        const schedule::Schedule plan_schedule = schedule::make_schedule(kind, W, S, m);
        for (const CheckpointMode mode : modes) {
          family_plan.checkpoint = mode;
          const Family family(family_plan, plan_schedule, model_costs, resolved);
          Plan best = family.search();
          if (family.excess(best) > 0) {
            report.rejected.push_back(
                {best.family(),
                 c10::str("over the cap: needs ", mib(best.largest_peak_bytes()),
                          " on a worker, the cap is ", mib(options.memory_cap())),
                 best.largest_peak_bytes()});
            continue;
          }
          report.plans.push_back(std::move(best));
          if (mode == CheckpointMode::kNever) {  // the modes after it only add recomputation
            for (size_t slower = 1; slower < modes.size(); ++slower) {
              report.rejected.push_back(
                  {c10::str(shape, ", checkpoint ", modes[slower]), kFitsWithout});
            }
            break;
          }
        }
      }
    }
  }
  std::stable_sort(report.plans.begin(), report.plans.end(),
                   [](const Plan& a, const Plan& b) { return a.step_seconds < b.step_seconds; });
  report.search_seconds = std::chrono::duration<double>(Clock::now() - begun).count();
  return report;
}

}  // namespace

PlanReport plan(torch::nn::Sequential model, const Batch& sample, const PlanOptions& options) {
  return plan_with(std::move(model), sample, nullptr, nullptr, options);
}

PlanReport plan(torch::nn::Sequential model, const Batch& sample, const Batch& target,
                const schedule::LossFunction& loss, const PlanOptions& options) {
  return plan_with(std::move(model), sample, &target, &loss, options);
}

std::ostream& operator<<(std::ostream& out, const PlanReport& report) {
  char line[256];
  std::snprintf(line, sizeof(line), "%-3s %-17s %6s %6s %-12s %12s %8s %14s  %s\n", "#", "schedule",
                "stages", "micro", "checkpoint", "step", "bubble", "peak / worker", "balance");
  out << line;
  const size_t shown = std::min<size_t>(report.plans.size(), kRowsShown);
  for (const auto k : c10::irange(shown)) {
    const Plan& p = report.plans[k];
    std::ostringstream balance;
    for (const auto s : c10::irange(p.balance.size())) balance << (s ? "," : "") << p.balance[s];
    std::snprintf(line, sizeof(line), "%-3zu %-17s %6lld %6lld %-12s %9.2f ms %7.1f%% %14s  %s\n",
                  k + 1, c10::str(p.schedule).c_str(), static_cast<long long>(p.balance.size()),
                  static_cast<long long>(p.microbatches), c10::str(p.checkpoint).c_str(),
                  1e3 * p.step_seconds, 100 * p.bubble_fraction,
                  mib(p.largest_peak_bytes()).c_str(), balance.str().c_str());
    out << line;
  }
  if (shown < report.plans.size()) {
    out << "... and " << report.plans.size() - shown << " slower plans\n";
  }
  int64_t fit_without = 0;
  for (const auto& r : report.rejected) {
    if (r.reason == kFitsWithout) {
      ++fit_without;
    } else {
      out << "ruled out: " << r.family << ": " << r.reason << "\n";
    }
  }
  if (fit_without > 0) {
    out << "ruled out: " << fit_without << " checkpointed families that fit without "
        << "checkpointing (recomputing adds time)\n";
  }
  if (!report.calibration.empty()) {
    out << "calibrated, a pipeline's times over the profile's, forward / backward:";
    for (const auto& c : report.calibration) {
      std::snprintf(line, sizeof(line), "%s %lld micro-batches %.2f / %.2f",
                    &c == &report.calibration.front() ? "" : ",",
                    static_cast<long long>(c.microbatches), c.forward, c.backward);
      out << line;
    }
    out << "\n";
  }
  if (report.cores > 0) {
    out << "predicted on " << report.cores << " core" << (report.cores == 1 ? "" : "s")
        << " shared by the workers\n";
  }
  std::snprintf(line, sizeof(line), "profiled in %.2f s, searched in %.2f s\n",
                report.profile_seconds, report.search_seconds);
  return out << line;
}

}  // namespace gpipe

#include "gpipe/distributed/pipeline_stage.h"

#include "detail/autocast_state.h"
#include "detail/exact.h"
#include "detail/message_of.h"
#include "detail/split.h"
#include "detail/stream.h"
#include "distributed/clock_alignment.h"
#include "distributed/failure_monitor.h"
#include "distributed/rank_parameters.h"
#include "gpipe/amp/grad_scaler.h"
#include "schedule/engine.h"
#include "schedule/gradient_norm.h"
#include "schedule/pipeline_parameters.h"
#include "schedule/receive_window.h"
#include "schedule/run_actions.h"
#include "schedule/set_aside_gradients.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

namespace gpipe {
namespace distributed {

PipelineStageOptions::PipelineStageOptions(int64_t chunks)
    : ScheduleOptions(chunks, /*intra_op_threads=*/0) {}

c10::Device default_device(const Environment& environment) {
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  if (count == 0) return c10::Device(c10::kCPU);
  TORCH_CHECK_VALUE(environment.local_rank < count, "LOCAL_RANK ", environment.local_rank,
                    " has no CUDA device of its own: this machine has ", count,
                    " (start at most that many ranks per machine, or set the device option)");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(environment.local_rank));
}

namespace {

// Fails at the start, before any rank waits for another, for a layout the job cannot run.
void check_layout(int64_t world_size, const torch::nn::Sequential& module,
                  const std::vector<int64_t>& balance, const PipelineStageOptions& options) {
  options.check("rank");
  const int64_t D = options.data_parallel();
  TORCH_CHECK_VALUE(D > 0 && world_size % D == 0, "data_parallel (", D,
                    ") must be positive and divide WORLD_SIZE = ", world_size);
  const int64_t P = world_size / D;
  const std::string ranks =
      c10::str("WORLD_SIZE = ", world_size, " ranks",
               (D > 1 ? " in " + std::to_string(D) + " replicas" : std::string()));
  if (const auto& custom = options.custom_schedule()) {
    TORCH_CHECK_VALUE(custom->num_workers == P, "the custom schedule has ", custom->num_workers,
                      " workers, but ", ranks, " make pipelines of ", P);
    TORCH_CHECK_VALUE(static_cast<int64_t>(balance.size()) == custom->num_stages, "balance names ",
                      balance.size(), " stages, but the custom schedule runs ", custom->num_stages);
  } else {
    const detail::Exact stages = detail::Exact(P) * options.stages_per_worker();
    TORCH_CHECK_VALUE(static_cast<detail::Exact>(balance.size()) == stages, "balance names ",
                      balance.size(), " stages, but ", ranks, " with ", options.stages_per_worker(),
                      " stage(s) each run ", detail::to_string(stages));
  }
  detail::check_balance(module, balance);
  schedule::detail::verify_skips(detail::split_by_balance(module, balance));
}

}  // namespace

PipelineStage::PipelineStage(const torch::nn::Sequential& module,
                             const std::vector<int64_t>& balance, schedule::LossFunction loss,
                             PipelineStageOptions options)
    : PipelineStage(
          [&] {
            const Environment env = read_environment();
            check_layout(env.world_size, module, balance, options);
            return rendezvous(env, options.rendezvous_timeout());
          }(),
          module, balance, std::move(loss), options) {}

PipelineStage::PipelineStage(ProcessGroup group, const torch::nn::Sequential& module,
                             const std::vector<int64_t>& balance, schedule::LossFunction loss,
                             PipelineStageOptions options)
    : options_(std::move(options)), loss_(std::move(loss)) {
  TORCH_CHECK_VALUE(static_cast<bool>(loss_), "the loss function is empty");
  check_layout(group.world_size(), module, balance, options_);
  const int64_t P = group.world_size() / options_.data_parallel();
  const int64_t rank = group.rank();
  // The default only where none is given: it fails for a LOCAL_RANK without a GPU of its own.
  const c10::Device device = detail::normalize_device(
      options_.device() ? *options_.device() : default_device(group.environment));
  num_stages_ = static_cast<int64_t>(balance.size());
  by_index_.assign(num_stages_, nullptr);
  auto parts = detail::split_by_balance(module, balance);
  const skip::SkipLayout skips = skip::inspect_skip_layout(parts);
  const schedule::Placement placement = options_.placement();
  auto parameters = detail::pipeline_parameters(parts);
  std::vector<int64_t> rank_of_stage;  // in this rank's replica
  for (const auto s : c10::irange(num_stages_)) {
    rank_of_stage.push_back(rank / P * P + schedule::worker_of(placement, s, P));
  }
  for (const auto s : c10::irange(num_stages_)) {
    if (schedule::worker_of(placement, s, P) != rank % P) continue;
    parts[s]->to(device);
    stages_.push_back(std::make_unique<schedule::Stage>(s, num_stages_, std::move(parts[s]), device,
                                                        options_.checkpoint(), &skips));
    by_index_[s] = stages_.back().get();
  }
  // Named after the transport that comes next, which is numbered alike on every rank.
  const std::string transport_name = "transport" + std::to_string(group.transports->load());
  if (options_.data_parallel() > 1) {
    replicas_ = std::make_unique<ReplicaGroup>(group, P, "replicas_of_" + transport_name,
                                               options_.rendezvous_timeout());
  }
  parameters_ = std::make_unique<RankParameters>(
      group, std::move(parameters), std::move(rank_of_stage),
      "parameters_of_" + transport_name + "/replica" + std::to_string(rank / P),
      options_.rendezvous_timeout());
  // The store and this transport's number, for the clock alignment.
  BoundedStore store(group.store, options_.timeout());
  const Environment environment = group.environment;
  const std::string timeline = transport_name;
  schedules_ = std::make_unique<schedule::detail::ScheduleCache>(
      options_.schedule(), P, num_stages_, /*queue_capacity=*/0, options_.custom_schedule());
  // Fails early for a schedule that cannot run these stages.
  schedules_->prepare();
  TORCH_CHECK_VALUE(options_.receive_window() >= 0, "receive_window must be non-negative, but got ",
                    options_.receive_window());
  transport_ = std::make_unique<C10dTransport>(
      std::move(group), num_stages_,
      C10dTransportOptions()
          .timeout(options_.timeout())
          .poll_interval(options_.poll_interval())
          .pipeline_size(P)
          .placement(placement)
          .device(device)
          .receive_window(options_.receive_window() > 0 ? options_.receive_window()
                                                        : automatic_receive_window()));
  // Every rank aligns its clock, traced or not (rank 0 answers the others whatever its own
  // options), before the barrier: no rank is still aligning when another steps.
  const TimelineOrigin origin =
      align_clocks(store, environment, timeline, options_.rendezvous_timeout());
  if (const auto& tracer = options_.tracer()) {
    tracer->join_timeline(rank, origin.origin, origin.uncertainty_us);
  }
  // A tie whose copies differ is named by its ranks in the store, and refused by every rank
  // once all have compared.
  const std::string differing_ties = "gpipe/" + transport_name + "/differing_tied_copies";
  const std::string differing = parameters_->differing_tied_copies();
  if (!differing.empty()) {
    store.set(differing_ties, differing);
  }
  // No step starts before every rank has connected: a rank that dies later is seen through its
  // closed connections, never waited for by a rank still connecting (which only the rendezvous
  // timeout would end).
  transport_->barrier("connected", options_.rendezvous_timeout());
  if (!parameters_->model_has_ties_across_ranks()) return;
  bool differs = false;
  try {
    differs = store.check(differing_ties);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, lost_store_message(environment, detail::message_of(error)), " while rank ",
                rank, " looked for tied parameters whose copies differ");
  }
  TORCH_CHECK_VALUE(!differs, store.get(differing_ties));
}

PipelineStage::~PipelineStage() = default;

std::vector<int64_t> PipelineStage::stage_indices() const {
  std::vector<int64_t> indices;
  for (const auto& stage : stages_) indices.push_back(stage->index());
  return indices;
}

torch::nn::Sequential& PipelineStage::stage_module(int64_t index) {
  TORCH_CHECK_INDEX(index >= 0 && index < num_stages_ && by_index_[index] != nullptr, "rank ",
                    rank(), " does not run stage ", index, " (it runs stages ",
                    c10::Join(", ", stage_indices()), ")");
  return by_index_[index]->module();
}

const schedule::Schedule& PipelineStage::schedule(int64_t num_microbatches) {
  return schedules_->get(num_microbatches);
}

at::Tensor PipelineStage::step(const Batch& input, const Batch& target) {
  return run(input, &target, /*training=*/true).loss;
}

schedule::Evaluation PipelineStage::evaluate(const Batch& input) {
  return run(input, nullptr, /*training=*/false);
}

schedule::Evaluation PipelineStage::evaluate(const Batch& input, const Batch& target) {
  return run(input, &target, /*training=*/false);
}

std::vector<at::Tensor> PipelineStage::parameters() const { return parameters_->local(); }

double PipelineStage::clip_grad_norm(double max_norm, double norm_type, bool error_if_nonfinite) {
  detail::check_clip_options(max_norm, norm_type);
  return parameters_->clip_grad_norm(max_norm, norm_type, error_if_nonfinite);
}

int64_t PipelineStage::automatic_receive_window() {
  return schedule::detail::automatic_receive_window(
      schedules_->get(options_.custom_schedule()
                          ? options_.custom_schedule()->num_microbatches
                          : std::max(options_.chunks(), schedule::min_microbatches(
                                                            options_.schedule(), num_stages_))));
}

void PipelineStage::expect_receives(const std::vector<schedule::Action>& actions) {
  using schedule::ActionKind;
  using schedule::Lane;
  // A message from a stage of this rank never reaches the transport (run_actions.h).
  const auto elsewhere = [this](int64_t stage) { return by_index_[stage] == nullptr; };
  std::map<std::tuple<int64_t, int64_t, Lane>, int64_t> receives;  // per (from, to, lane)
  // A forward takes one skip message from each other stage whose stashes it pops, a backward
  // one from each that pops its stashes (run_actions.h).
  const auto skips_from = [&](const std::vector<skip::SkipRoute>& routes, int64_t stage) {
    std::set<int64_t> others;
    for (const auto& route : routes) {
      const int64_t other = route.other_stage(stage);
      if (elsewhere(other)) others.insert(other);
    }
    for (const int64_t other : others) ++receives[{other, stage, Lane::kSkip}];
  };
  for (const auto& a : actions) {
    const schedule::Stage& stage = *by_index_[a.stage];
    switch (a.kind) {
      case ActionKind::kRecvActivation:
        if (elsewhere(a.stage - 1)) ++receives[{a.stage - 1, a.stage, Lane::kPipeline}];
        break;
      case ActionKind::kRecvGradient:
        if (elsewhere(a.stage + 1)) ++receives[{a.stage + 1, a.stage, Lane::kPipeline}];
        break;
      case ActionKind::kForward:
        skips_from(stage.skip_pops(), a.stage);
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        skips_from(stage.skip_stashes(), a.stage);
        break;
      default:
        break;
    }
  }
  for (const auto& [edge, count] : receives) {
    const auto& [from, to, lane] = edge;
    transport_->expect(from, to, count, lane);
  }
}

schedule::Evaluation PipelineStage::run(const Batch& input, const Batch* target, bool training) {
  const int64_t last_rank = transport_->rank_of(num_stages_ - 1);
  const int64_t first_rank = transport_->rank_of(0);
  schedule::Evaluation result;
  double collective_seconds = 0;  // in all-reduces after the schedule
  transport_->reset_communication_seconds();
  transport_->begin_step();
  if (options_.intra_op_threads() > 0) {
    at::set_num_threads(static_cast<int>(options_.intra_op_threads()));
  }
  trace::UseTracer use_tracer(options_.tracer().get(), rank(), steps_++);
  try {
    if (training) schedule::detail::check_training_mode();
    const schedule::detail::StepBatches batches =
        schedule::detail::split_step(input, target, options_.chunks(), options_.loss_reduction());
    const int64_t M = batches.size();
    const std::shared_ptr<amp::GradScaler> scaler = training ? options_.grad_scaler() : nullptr;
    const schedule::Schedule& plan = training ? schedule(M) : schedules_->forward_only(M);
    for (auto& stage : stages_) stage->begin_step(M, scaler ? scaler->scale() : 1.0);
    // Every receive of the step is posted ahead of need, so a sender never waits for this rank.
    const auto& actions = plan.actions[rank() % pipeline_size()];
    expect_receives(actions);
    schedule::StepInputs inputs = batches.with(loss_);
    std::vector<Batch> outputs;
    if (!training) {
      outputs.assign(M, Batch(at::Tensor()));
      inputs.outputs = &outputs;
    }
    // The step's own gradients are unscaled, averaged over replicas and summed over ties
    // (set_aside_gradients.h): every parameter's under a scaler or with replicas, else only the
    // tied ones', so that the others accumulate in place rather than hold a second gradient
    // through the step.
    std::optional<detail::SetAsideGradients> accumulated;
    if (training && (scaler || replicas_)) {
      accumulated.emplace(parameters_->local());
    } else if (training && parameters_->has_tied()) {
      accumulated.emplace(parameters_->tied());
    }
    // The loss travels as (value, dtype) in double precision.
    at::Tensor message = at::empty({2}, at::kDouble);
    if (target != nullptr && rank() != last_rank) {
      transport_->post_recv_from_rank(last_rank, message);
    }
    std::vector<at::Tensor> losses(M);
    const bool sums_ties = training && parameters_->has_tied();
    if (sums_ties) parameters_->post_tied_receives();
    {
      detail::UseAutocast no_cast_cache(detail::AutocastState::current());
      schedule::run_actions(actions, by_index_, *transport_, inputs, losses);
    }
    if (sums_ties) parameters_->send_tied_gradients();
    // The next step's first activations may be sent before this rank ends this one (it may wait
    // for the tied gradients): their receives go out now.
    for (const auto s : c10::irange(int64_t{1}, num_stages_)) {
      if (by_index_[s] != nullptr && by_index_[s - 1] == nullptr) {
        transport_->expect_in_next_step(s - 1, s);
      }
    }
    if (target != nullptr && rank() == last_rank) {
      result.loss = schedule::detail::total_loss(losses);
      message[0] = result.loss.item<double>();
      message[1] = static_cast<double>(result.loss.scalar_type());
      for (const auto r : c10::irange(first_rank, first_rank + pipeline_size())) {
        if (r != rank()) transport_->send_to_rank(message, r);
      }
    } else if (target != nullptr) {
      transport_->recv_from_rank(last_rank, message);
      result.loss = at::scalar_tensor(message[0].item<double>(),
                                      static_cast<c10::ScalarType>(message[1].item<double>()));
    }
    transport_->flush();
    if (!training && rank() == last_rank) result.output = gather(outputs);
    const auto start = std::chrono::steady_clock::now();
    if (sums_ties) parameters_->sum_tied_gradients();
    if (replicas_) {
      // Each replica's gradients and loss, averaged: those of the mean over all their batches.
      at::Tensor replica_loss;
      std::vector<at::Tensor*> tensors;
      if (result.loss.defined()) {
        replica_loss = result.loss.detach().to(at::kDouble).reshape({1});
        tensors.push_back(&replica_loss);
      }
      std::vector<at::Tensor> parameters =
          training ? parameters_->local() : std::vector<at::Tensor>{};
      for (auto& p : parameters) {
        if (!p.requires_grad()) continue;
        if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
        tensors.push_back(&p.mutable_grad());
      }
      replicas_->all_reduce(tensors, options_.loss_reduction() == schedule::LossReduction::kMean);
      if (result.loss.defined()) result.loss = replica_loss[0].to(result.loss.scalar_type());
    }
    if (scaler) {
      scaler->unscale(parameters_->local(), [&](bool found) { return parameters_->any(found); });
    }
    accumulated.reset();
    collective_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } catch (const std::exception& error) {
    last_communication_seconds_ = transport_->communication_seconds() + collective_seconds;
    last_transfer_seconds_ = transport_->transfer_seconds() + collective_seconds;
    transport_->report_failure(detail::message_of(error));
    for (auto& stage : stages_) stage->clear();
    throw;
  }
  last_communication_seconds_ = transport_->communication_seconds() + collective_seconds;
  last_transfer_seconds_ = transport_->transfer_seconds() + collective_seconds;
  return result;
}

}  // namespace distributed
}  // namespace gpipe

// One rank of the multi-process tests (distributed_*_test.cpp), started by gpipe_launch.
//
// Usage: distributed_worker --out DIR [--schedule gpipe|1f1b|interleaved_1f1b|zb1p]
//            [--stages-per-worker V] [--chunks M] [--timeout-ms T] [--checkpoint MODE]
//            [--data-parallel D]
//            [--fail-rank R --fail-mode throw|kill|hang|stop|mismatch|kill-connected]
//            [--fail-attempts K] [--rendezvous-timeout-ms T] [--absent-from R] [--trace 1]
//            [--steps N] [--schedule-file F] [--skips 1] [--receive-window W]
//            [--loss-reduction mean|sum]
//
// Trains one step (or N on the same batch, gradients adding up) of the model of
// distributed_model.h (W x V stages of even layers) and writes DIR/loss_rank<r>.pt and
// DIR/grads_stage<s>_replica<d>.pt (the gradients of the stage's parameters, in order; with D
// replicas, replica d trains on the d-th slice of the batch); DIR/start_time_rank<r> and, once
// its PipelineStage is built (every rank connected), DIR/connected_time_rank<r> (ms since the
// epoch); DIR/ok_rank<r> on success, or DIR/error_rank<r> with the message, DIR/error_time_rank<r>
// with when it came, and exit status 1. With --fail-rank R, stage R (on rank R) ends in a trap
// that, on the second micro-batch, throws, SIGKILLs its own process, sleeps for an hour, SIGSTOPs
// its process, or widens its output; kill-connected SIGKILLs rank R as soon as its PipelineStage is
// constructed (every rank connected). With --fail-attempts K, the failure comes only in torchrun's
// first K attempts (TORCHELASTIC_RESTART_COUNT < K), so that a restarted group succeeds. With
// --absent-from R, ranks R and above exit at once, never joining. With --trace 1, each rank also
// writes its tracer's events as DIR/trace_rank<r>.json (trace.h), and its timeline's origin on
// the steady clock and that origin's uncertainty (microseconds) as DIR/clock_rank<r>.txt. With
// --schedule-file F, the ranks run the schedule of file F (schedule_file.h), whose stages the model
// is cut into. With
// --skips 1, the model has its skip connections across stages. --receive-window W sets
// PipelineStageOptions::receive_window (default 0: automatic); --loss-reduction its
// loss_reduction (default mean).
//
// Training recipes, with --optimizer-steps N: N steps of SGD (lr 0.1) on pipe.parameters(), each
// zeroing the gradients, stepping, clipping by the global norm with --clip X (X > 0), and, with
// --scaler 1, stepping through a GradScaler (init scale 2^10, growth interval 2); with
// --overflow-rank R --overflow-step K the last parameter of rank R (untied) gets an infinite
// gradient in step K. --tied 1 trains tied_model(); --precision bf16 the recording model in float32
// under CPU autocast (bfloat16). Writes DIR/recipe_rank<r>.txt ("step K loss L norm N stepped S
// scale X" per step), DIR/unclipped_stage<s>_replica<d>.pt (the last step's gradients before
// clipping), DIR/grads_... (after it), DIR/params_stage<s>_replica<d>.pt (the trained parameters)
// and, with
// --precision, DIR/dtypes_rank<r>.txt ("layer: what it saw" per line). --evaluate 1 evaluates
// before the first step and after the last: DIR/eval_{before,after}_loss_rank<r>.pt and, on the
// last stage's rank, DIR/eval_{before,after}_output_replica<d>.pt. --perturb-tie 1 changes the
// tied parameter on the last rank before the PipelineStage is built.
#include "distributed_model.h"
#include "gpipe/amp/autocast.h"
#include "gpipe/amp/grad_scaler.h"
#include "gpipe/distributed/pipeline_stage.h"
#include "gpipe/schedule/schedule_file.h"
#include "gpipe/trace.h"

#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text << "\n";
}

void save_tensors_of(gpipe::distributed::PipelineStage& pipe, const std::string& path_of_stage,
                     bool grads) {
  for (const int64_t s : pipe.stage_indices()) {
    std::vector<torch::Tensor> tensors;
    for (const auto& p : pipe.stage_module(s)->parameters()) {
      tensors.push_back(grads ? p.grad() : p.detach());
    }
    torch::save(tensors, path_of_stage + std::to_string(s) + "_replica" +
                             std::to_string(pipe.replica()) + ".pt");
  }
}

struct Recipe {
  int64_t optimizer_steps = 0;
  double clip = 0;
  bool evaluate = false;
  bool bf16 = false;
  int64_t overflow_rank = -1;
  int64_t overflow_step = -1;
};

// The training loop of --optimizer-steps (see the top of this file).
void train_recipe(gpipe::distributed::PipelineStage& pipe, const Recipe& recipe,
                  const torch::Tensor& input, const torch::Tensor& target, const std::string& out) {
  const int64_t rank = pipe.rank();
  const std::string suffix = "_rank" + std::to_string(rank);
  const auto autocast = [&] {
    return std::make_unique<gpipe::amp::Autocast>(torch::kCPU, torch::kBFloat16, recipe.bf16);
  };
  const auto evaluate = [&](const std::string& when) {
    const auto guard = autocast();
    const auto evaluation = pipe.evaluate(input, target);
    torch::save(evaluation.loss, out + "/eval_" + when + "_loss" + suffix + ".pt");
    if (evaluation.output) {
      torch::save(evaluation.output->tensor(), out + "/eval_" + when + "_output_replica" +
                                                   std::to_string(pipe.replica()) + ".pt");
    }
  };
  torch::optim::SGD sgd(pipe.parameters(), torch::optim::SGDOptions(0.1));
  const auto& scaler = pipe.options().grad_scaler();
  std::ofstream log(out + "/recipe" + suffix + ".txt");
  log.precision(17);
  if (recipe.evaluate) evaluate("before");
  for (int64_t step = 0; step < recipe.optimizer_steps; ++step) {
    sgd.zero_grad();
    torch::Tensor poisoned;
    unsigned hook = 0;
    if (rank == recipe.overflow_rank && step == recipe.overflow_step) {
      poisoned = pipe.parameters().back();
      hook = poisoned.register_hook(
          [](torch::Tensor grad) { return grad * std::numeric_limits<double>::infinity(); });
    }
    torch::Tensor loss;
    {
      const auto guard = autocast();
      loss = pipe.step(input, target);
    }
    if (poisoned.defined()) poisoned.remove_hook(hook);
    if (step == recipe.optimizer_steps - 1) save_tensors_of(pipe, out + "/unclipped_stage", true);
    const double norm = recipe.clip > 0 ? pipe.clip_grad_norm(recipe.clip) : 0.0;
    bool stepped = true;
    if (scaler) {
      stepped = scaler->step(sgd);
      scaler->update();
    } else {
      sgd.step();
    }
    log << "step " << step << " loss " << loss.item<double>() << " norm " << norm << " stepped "
        << stepped << " scale " << (scaler ? scaler->scale() : 1.0) << "\n";
  }
  save_tensors_of(pipe, out + "/grads_stage", true);
  save_tensors_of(pipe, out + "/params_stage", false);
  if (recipe.evaluate) evaluate("after");
  if (recipe.bf16) {
    std::ofstream dtypes(out + "/dtypes" + suffix + ".txt");
    std::lock_guard<std::mutex> lock(gpipe::testing::dtype_log_mutex());
    for (const auto& [layer, seen] : gpipe::testing::dtype_log()) {
      for (const auto& what : seen) dtypes << layer << ": " << what << "\n";
    }
  }
}

int fail(const std::string& out, int64_t rank, const std::string& message) {
  const std::string suffix = "_rank" + std::to_string(rank);
  write_text(out + "/error_time" + suffix,
             std::to_string(gpipe::testing::milliseconds_since_epoch()));
  write_text(out + "/error" + suffix, message);
  std::cerr << "rank " << rank << ": " << message << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, schedule = "1f1b", fail_mode, checkpoint = "never", schedule_file;
  int64_t stages_per_worker = 1, chunks = 4, timeout_ms = 60000, fail_rank = -1, replicas = 1;
  int64_t rendezvous_timeout_ms = 60000, absent_from = -1, trace = 0, fail_attempts = -1;
  int64_t steps = 1, skips = 0, tied = 0, scaler = 0, perturb_tie = 0, receive_window = 0;
  std::string precision = "fp64", loss_reduction = "mean";
  Recipe recipe;
  for (int k = 1; k + 1 < argc; k += 2) {
    const std::string flag = argv[k];
    const std::string value = argv[k + 1];
    if (flag == "--out")
      out = value;
    else if (flag == "--schedule")
      schedule = value;
    else if (flag == "--checkpoint")
      checkpoint = value;
    else if (flag == "--stages-per-worker")
      stages_per_worker = std::stoll(value);
    else if (flag == "--chunks")
      chunks = std::stoll(value);
    else if (flag == "--timeout-ms")
      timeout_ms = std::stoll(value);
    else if (flag == "--fail-rank")
      fail_rank = std::stoll(value);
    else if (flag == "--data-parallel")
      replicas = std::stoll(value);
    else if (flag == "--fail-mode")
      fail_mode = value;
    else if (flag == "--rendezvous-timeout-ms")
      rendezvous_timeout_ms = std::stoll(value);
    else if (flag == "--absent-from")
      absent_from = std::stoll(value);
    else if (flag == "--trace")
      trace = std::stoll(value);
    else if (flag == "--fail-attempts")
      fail_attempts = std::stoll(value);
    else if (flag == "--steps")
      steps = std::stoll(value);
    else if (flag == "--schedule-file")
      schedule_file = value;
    else if (flag == "--skips")
      skips = std::stoll(value);
    else if (flag == "--tied")
      tied = std::stoll(value);
    else if (flag == "--optimizer-steps")
      recipe.optimizer_steps = std::stoll(value);
    else if (flag == "--clip")
      recipe.clip = std::stod(value);
    else if (flag == "--evaluate")
      recipe.evaluate = std::stoll(value) != 0;
    else if (flag == "--scaler")
      scaler = std::stoll(value);
    else if (flag == "--overflow-rank")
      recipe.overflow_rank = std::stoll(value);
    else if (flag == "--overflow-step")
      recipe.overflow_step = std::stoll(value);
    else if (flag == "--precision")
      precision = value;
    else if (flag == "--perturb-tie")
      perturb_tie = std::stoll(value);
    else if (flag == "--receive-window")
      receive_window = std::stoll(value);
    else if (flag == "--loss-reduction")
      loss_reduction = value;
  }
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool failing_attempt =
      fail_attempts < 0 || std::atoll(attempt ? attempt : "0") < fail_attempts;
  const int64_t rank = std::atoll(std::getenv("RANK") ? std::getenv("RANK") : "0");
  const std::string suffix = "_rank" + std::to_string(rank);
  if (absent_from >= 0 && rank >= absent_from) return 0;
  write_text(out + "/start_time" + suffix,
             std::to_string(gpipe::testing::milliseconds_since_epoch()));
  try {
    const int64_t world = std::atoll(std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "1");
    std::optional<gpipe::schedule::Schedule> custom;
    if (!schedule_file.empty()) custom = gpipe::schedule::read_schedule_file(schedule_file);
    const int64_t S = custom ? custom->num_stages : world / replicas * stages_per_worker;
    std::vector<int64_t> balance = gpipe::testing::distributed_balance(S);
    // The failing rank's first stage ends in the trap; every rank has it, unarmed elsewhere.
    recipe.bf16 = precision == "bf16";
    torch::nn::Sequential model =
        tied != 0 ? gpipe::testing::tied_model()
                  : gpipe::testing::distributed_model(balance, fail_rank, fail_mode,
                                                      fail_rank == rank && failing_attempt,
                                                      skips != 0, recipe.bf16);
    auto [input, target] =
        tied != 0 ? gpipe::testing::tied_batch() : gpipe::testing::distributed_batch();
    if (recipe.bf16) {
      input = input.to(torch::kFloat);
      target = target.to(torch::kFloat);
    }
    if (perturb_tie != 0 && rank == world - 1) {
      torch::NoGradGuard no_grad;
      model->ptr(0)->parameters()[0].add_(1e-3);
    }
    if (replicas > 1) {
      // Replica d trains on the d-th of `replicas` equal slices of the batch.
      const int64_t replica = rank / (world / replicas);
      input = input.chunk(replicas)[replica];
      target = target.chunk(replicas)[replica];
    }

    auto options = gpipe::distributed::PipelineStageOptions(chunks);
    if (custom) options.custom_schedule(*custom);
    gpipe::distributed::PipelineStage pipe(
        model, balance,
        [](const gpipe::Batch& y, const gpipe::Batch& t) {
          return torch::mse_loss(y.tensor(), t.tensor());
        },
        options.schedule(gpipe::schedule::parse_schedule_kind(schedule))
            .stages_per_worker(stages_per_worker)
            .checkpoint(gpipe::parse_checkpoint_mode(checkpoint))
            .data_parallel(replicas)
            .timeout(std::chrono::milliseconds(timeout_ms))
            .receive_window(receive_window)
            .loss_reduction(loss_reduction == "sum" ? gpipe::schedule::LossReduction::kSum
                                                    : gpipe::schedule::LossReduction::kMean)
            .rendezvous_timeout(std::chrono::milliseconds(rendezvous_timeout_ms))
            .tracer(trace != 0 ? std::make_shared<gpipe::trace::Tracer>() : nullptr)
            .grad_scaler(
                scaler != 0
                    ? std::make_shared<gpipe::amp::GradScaler>(
                          gpipe::amp::GradScalerOptions().init_scale(1024).growth_interval(2))
                    : nullptr));
    write_text(out + "/connected_time" + suffix,
               std::to_string(gpipe::testing::milliseconds_since_epoch()));
    if (fail_mode == "kill-connected" && rank == fail_rank && failing_attempt) {
      gpipe::testing::say_when("killing");
      raise(SIGKILL);
    }
    try {
      if (recipe.optimizer_steps > 0) {
        train_recipe(pipe, recipe, input, target, out);
        write_text(out + "/ok" + suffix, "ok");
        return 0;
      }
      torch::Tensor loss;
      for (int64_t step = 0; step < steps; ++step) loss = pipe.step(input, target);
      torch::save(loss, out + "/loss" + suffix + ".pt");
      if (const auto& tracer = pipe.options().tracer()) {
        std::ofstream json(out + "/trace" + suffix + ".json");
        gpipe::trace::write_chrome_trace(tracer->events(), json);
        // The timeline's origin on this machine's steady clock (which every rank shares), in
        // microseconds, and how exactly the rank knows it.
        const double origin_us = std::chrono::duration<double, std::micro>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count() -
                                 tracer->now_us();
        std::ofstream clock(out + "/clock" + suffix + ".txt");
        clock.precision(17);
        clock << origin_us << " " << tracer->clock_uncertainty_us() << "\n";
      }
      for (const int64_t s : pipe.stage_indices()) {
        std::vector<torch::Tensor> grads;
        for (const auto& p : pipe.stage_module(s)->parameters()) grads.push_back(p.grad());
        torch::save(grads, out + "/grads_stage" + std::to_string(s) + "_replica" +
                               std::to_string(pipe.replica()) + ".pt");
      }
    } catch (const c10::Error& error) {
      // The PipelineStage must be destroyed before the process exits (see pipeline_stage.h).
      return fail(out, rank, error.what_without_backtrace());
    }
  } catch (const c10::Error& error) {
    return fail(out, rank, error.what_without_backtrace());
  } catch (const std::exception& error) {
    return fail(out, rank, error.what());
  }
  write_text(out + "/ok" + suffix, "ok");
  return 0;
}

// One rank of the multi-process tests (distributed_*_test.cpp), started by gpipe_launch.
//
// Usage: distributed_worker --out DIR [--schedule gpipe|1f1b|interleaved_1f1b|zb1p]
//            [--stages-per-worker V] [--chunks M] [--timeout-ms T] [--checkpoint MODE]
//            [--data-parallel D]
//            [--fail-rank R --fail-mode throw|kill|hang|stop|mismatch|kill-connected]
//            [--fail-attempts K] [--rendezvous-timeout-ms T] [--absent-from R] [--trace 1]
//            [--steps N] [--schedule-file F] [--skips 1]
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
// --skips 1, the model has its skip connections across stages.
#include "distributed_model.h"
#include "gpipe/distributed/pipeline_stage.h"
#include "gpipe/schedule/schedule_file.h"
#include "gpipe/trace.h"

#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text << "\n";
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
  int64_t steps = 1, skips = 0;
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
    torch::nn::Sequential model = gpipe::testing::distributed_model(
        balance, fail_rank, fail_mode, fail_rank == rank && failing_attempt, skips != 0);
    auto [input, target] = gpipe::testing::distributed_batch();
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
            .rendezvous_timeout(std::chrono::milliseconds(rendezvous_timeout_ms))
            .tracer(trace != 0 ? std::make_shared<gpipe::trace::Tracer>() : nullptr));
    write_text(out + "/connected_time" + suffix,
               std::to_string(gpipe::testing::milliseconds_since_epoch()));
    if (fail_mode == "kill-connected" && rank == fail_rank && failing_attempt) {
      gpipe::testing::say_when("killing");
      raise(SIGKILL);
    }
    try {
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

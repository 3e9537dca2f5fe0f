// `gpipe train`: trains the char GPT (models/char_gpt.h) on text, pipelined over stages with an
// explicit schedule (gpipe::schedule), one worker thread per stage - or, started by gpipe launch
// or torchrun, as one rank of a multi-process pipeline (train_pipeline.h); shows progress, and
// at the end throughput, peak memory per stage and the measured bubble. Can save the model,
// write a Chrome trace and an SVG timeline of the tasks.
#pragma once

#include "arguments.h"
#include "models/char_gpt.h"
#include "text_corpus.h"

#include <gpipe/checkpoint.h>
#include <gpipe/distributed/environment.h>
#include <gpipe/distributed/rendezvous.h>
#include <gpipe/schedule/generators.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace gpipe {
namespace cli {

struct TrainConfig {
  std::vector<std::string> data = {kDefaultCorpusDirectory};
  models::CharGPTOptions model;
  int64_t steps = 300;
  int64_t batch_size = 32;
  double learning_rate = 2e-3;
  int64_t seed = 0;
  int64_t stages = 2;  // on ranks: WORLD_SIZE x virtual_stages
  int64_t chunks = 4;
  std::string schedule = "1f1b";
  std::string schedule_file;                          // a schedule of one's own, read into:
  std::optional<schedule::Schedule> custom_schedule;  // (schedule_file.h)
  int64_t virtual_stages = 1;    // stages per worker (schedule::check_schedule_options's rules)
  std::vector<int64_t> balance;  // layers per stage; empty: as even as the layers allow
  int64_t receive_window = 0;    // on ranks: PipelineStageOptions::receive_window (0: automatic)
  CheckpointMode checkpoint = CheckpointMode::kNever;
  int64_t threads = 1;               // intra-op threads per stage
  std::vector<c10::Device> devices;  // one per stage; on ranks, one per rank
  /// Set where WORLD_SIZE is: this process is one rank of a multi-process pipeline.
  std::optional<distributed::Environment> ranks;
  std::string load;      // start from this saved model
  std::string save;      // save the trained model here
  std::string trace;     // Chrome trace JSON of every task
  std::string timeline;  // SVG timeline of the last timeline_steps steps
  int64_t timeline_steps = 2;
  int64_t save_every = 0;          // steps between snapshots (train_snapshot.h); 0: none
  std::string snapshot_dir;        // where snapshots go and come from
  bool resume = false;             // continue from snapshot_dir's last snapshot, if any
  bool quiet = false;              // no progress or summary
  bool simulate = false;           // predict every schedule instead (train_simulate.h)
  std::string plan = "none";       // none, show or auto (train_plan.h)
  double memory_budget_mib = 0;    // for simulate and plan: per worker; 0: any
  std::string precision = "fp32";  // fp32, bf16 (autocast) or fp16 (autocast and loss scaling)
  double loss_scale = 65536;       // fp16: the loss scaler's first scale
  double clip_grad_norm = 0;       // clip by the global gradient norm; 0: no clipping
  int64_t eval_every = 0;          // steps between validation losses on held-out text; 0: none
};

/// Reads the flags of `gpipe train`, and the launcher's environment where WORLD_SIZE is set.
/// Throws UsageError for a bad flag, value or variable, a model with fewer layers than --stages,
/// or flags that contradict each other or the number of ranks.
TrainConfig parse_train_config(const std::vector<std::string>& args);

/// The model `c` trains, seeded (the caller seeds) or loaded; `options` receives its sizes.
torch::nn::Sequential make_model(const TrainConfig& c, models::CharGPTOptions& options);

/// The model as the commands' headers name it: "char GPT (4 blocks, width 32, 59520 parameters,
/// tied embeddings)", a tied parameter counted once, then " from <file>" where it was loaded.
std::string describe_model(const torch::nn::Sequential& model,
                           const models::CharGPTOptions& options, const std::string& file);

/// What the summary and snapshots call the schedule: its name, or "file <path>".
std::string schedule_name(const TrainConfig& c);

/// The `gpipe train --help` text.
std::string train_usage();

struct TrainReport {
  int64_t resumed_step = 0;    // the snapshot's step that --resume continued after, or 0
  std::vector<double> losses;  // per step this run took
  std::vector<std::pair<int64_t, double>> validation_losses;  // (step, loss), --eval-every
  int64_t skipped_steps = 0;  // optimizer steps the fp16 loss scaler skipped
  double seconds = 0;
  double samples_per_second = 0;
  std::vector<int64_t> peak_bytes_per_stage;  // allocated by each stage's tasks (on rank 0: all)
  double bubble_fraction = 0;                 // measured, over steps after the first
  double bubble_bound = 0;                    // the schedule's own, with equal stages
  int64_t traced_tasks = 0;                   // events in the trace
};

/// Trains as `config` says, printing progress to `out` (redrawn in place when `interactive`)
/// and a summary at the end; on ranks, rank 0 prints and writes every output file, the others
/// nothing. On ranks, `ranks` is the group met already (meet_ranks), or null to meet it here.
/// Throws UsageError for unreadable data or model files, c10::Error naming a failed rank.
TrainReport train(const TrainConfig& config, std::ostream& out, bool interactive,
                  const distributed::ProcessGroup* ranks = nullptr);

/// Connects to the other ranks of `config.ranks`, waiting as long as a pipeline stage does.
distributed::ProcessGroup meet_ranks(const TrainConfig& config);

}  // namespace cli
}  // namespace gpipe

// Snapshots of `gpipe train` (--save-every N --snapshot-dir DIR, --resume), on threads and on
// ranks alike.
//
//   DIR/step-<S>/rank-<r>.pt     each process's part: its layers' parameters and buffers, its
//                                optimizer's state (and fp16's loss scaler's), the step and the
//                                batch generator's state
//   DIR/step-<S>/manifest.txt    what must match to resume: engine and world size, balance,
//                                schedule, model sizes and ties, precision (rank 0)
//   DIR/latest                   "step-<S>": the last complete snapshot (rank 0)
//
// Every file is written beside its place, flushed to disk and renamed (atomic_file.h). Rank 0
// points DIR/latest at a step only once every rank's part of it is on disk, so a crash during a
// save leaves DIR/latest at the snapshot before. Every snapshot is kept.
//
// --resume continues from DIR/latest where there is one (rank 0 reads it and tells the others)
// and starts afresh where there is none, so one command line serves the first start and every
// restart. A snapshot made by another kind of run (world size, balance, schedule, model) is a
// UsageError naming each difference, raised on every rank before anything is loaded or written.
#pragma once

#include "train_pipeline.h"

#include <ATen/core/Generator.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gpipe {
namespace cli {

/// What a snapshot records of its run and a resumed run must match: (name, value) pairs.
using Manifest = std::vector<std::pair<std::string, std::string>>;

/// The manifest of the run `config` describes, with `options` (the model's sizes), `balance`
/// and `pipeline`.
Manifest make_manifest(const TrainConfig& config, const models::CharGPTOptions& options,
                       const std::vector<int64_t>& balance, const TrainPipeline& pipeline);

/// What one save cost this process.
struct SaveCost {
  double seconds = 0;  // from the start of its write to the snapshot counting
  int64_t bytes = 0;   // of its own part
};

/// Saves the state after step `step` in `dir`; every process calls it. Throws std::runtime_error
/// naming a file that cannot be written.
SaveCost save_snapshot(const std::string& dir, int64_t step, const Manifest& manifest,
                       TrainPipeline& pipeline, const torch::nn::Sequential& model,
                       const torch::optim::Optimizer& optimizer, at::Generator& batches);

/// Loads the last complete snapshot of `dir` into `model` (this process's layers),
/// `optimizer` and `batches`, and returns its step; returns 0 and loads nothing where `dir` has
/// none. Every process calls it. Throws UsageError if the snapshot does not fit `manifest` or
/// cannot be read.
int64_t resume_snapshot(const std::string& dir, const Manifest& manifest, TrainPipeline& pipeline,
                        const torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                        at::Generator& batches);

}  // namespace cli
}  // namespace gpipe

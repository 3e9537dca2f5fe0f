// The pipeline behind `gpipe train`: the worker threads of this process
// (schedule::PipelineSchedule), or, where a launcher started the process (gpipe launch,
// torchrun: WORLD_SIZE is set), this process's rank of a multi-process pipeline
// (distributed::PipelineStage). train() drives both alike. What only the ranks together know -
// every stage's peak memory, the bubble, the trace, the trained model - comes to rank 0, which
// reports, over the ranks' store once training ends.
#pragma once

#include "train.h"

#include <gpipe/amp/grad_scaler.h>
#include <gpipe/schedule/action.h>
#include <gpipe/trace.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpipe {
namespace cli {

/// What the reporting process learns at the end of training.
struct TrainSummary {
  std::vector<int64_t> peak_bytes;   // per stage: its tasks' CPU allocations, or its device's
  std::vector<c10::Device> devices;  // per stage
  trace::Utilization steady;         // over the recorded steps, every worker
  std::vector<trace::Event> kept;    // every worker's kept events, on one clock
  int64_t traced_tasks = 0;          // every worker's events, kept or not
  double clock_uncertainty_us = 0;   // of the ranks' clocks against rank 0's (threads: 0)
};

class TrainPipeline {
 public:
  /// Threads, or this process's rank where WORLD_SIZE is set (config.ranks). `model` is the
  /// whole model on every rank; its layers are the ones trained.
  /// On ranks, `ranks` is the group met already, or null to meet it here.
  static std::unique_ptr<TrainPipeline> make(const TrainConfig& config,
                                             const torch::nn::Sequential& model,
                                             const std::vector<int64_t>& balance,
                                             const distributed::ProcessGroup* ranks = nullptr);
  virtual ~TrainPipeline() = default;

  /// One training step (forward and backward of every micro-batch); the loss, on every rank.
  virtual at::Tensor step(const at::Tensor& input, const at::Tensor& target) = 0;
  /// The loss of the forwards only (the engines' evaluate()), on every rank.
  virtual at::Tensor evaluate(const at::Tensor& input, const at::Tensor& target) = 0;
  /// Clips every process's gradients by their global norm; returns the norm.
  virtual double clip_grad_norm(double max_norm) = 0;
  /// The schedule a step of `num_microbatches` micro-batches runs.
  virtual schedule::Schedule schedule(int64_t num_microbatches) = 0;
  /// The parameters this process trains, each once.
  virtual std::vector<at::Tensor> parameters() = 0;
  /// What records the steps' tasks: on ranks it has joined the ranks' timeline.
  const trace::Tracer& tracer() const { return *tracer_; }
  /// The loss scaler of --precision fp16 (amp/grad_scaler.h); null otherwise.
  const std::shared_ptr<amp::GradScaler>& grad_scaler() const { return grad_scaler_; }
  /// Whether this process prints progress and the summary (threads, or rank 0).
  virtual bool reports() const = 0;
  /// How the stages run, for the header line, e.g. "2 worker threads" or "2 ranks".
  virtual std::string workers() const = 0;

  /// This process among the pipeline's processes (threads: the only one, 0) and their count.
  virtual int64_t rank() const { return 0; }
  virtual int64_t world_size() const { return 1; }
  /// The layers (indices into the model) this process trains, in order.
  virtual std::vector<int64_t> layers() const = 0;
  /// Returns once every process has called it with `name` (threads: at once).
  virtual void barrier(const std::string& name) {}
  /// Rank 0's `value`, on every process (threads: `value`).
  virtual std::string broadcast(const std::string& name, const std::string& value) { return value; }

  /// Takes the events of the step that just ended: counted towards the bubble where `steady`,
  /// kept for the trace and timeline where `keep`.
  void record_step(bool steady, bool keep);

  /// After the last step, on every process: the summary, complete on the reporting one.
  virtual TrainSummary summarize() = 0;
  /// After the last step, on every process: the reporting one's model then holds every stage's
  /// trained parameters and buffers (for --save).
  virtual void gather_model() = 0;

 protected:
  TrainPipeline(std::shared_ptr<trace::Tracer> tracer, std::shared_ptr<amp::GradScaler> scaler)
      : tracer_(std::move(tracer)), grad_scaler_(std::move(scaler)) {}

  /// One recorded step on this process's clock: first begin, last end, compute time.
  struct StepTime {
    double begin_us = 0;
    double end_us = 0;
    double busy_us = 0;
  };

  std::shared_ptr<trace::Tracer> tracer_;
  std::shared_ptr<amp::GradScaler> grad_scaler_;
  std::vector<StepTime> steady_steps_;
  std::vector<trace::Event> kept_;
  int64_t traced_tasks_ = 0;
};

}  // namespace cli
}  // namespace gpipe

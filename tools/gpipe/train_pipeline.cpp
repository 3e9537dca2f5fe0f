#include "train_pipeline.h"

#include <gpipe/distributed/pipeline_stage.h>
#include <gpipe/memory.h>
#include <gpipe/schedule/runtime.h>

#include <c10/util/irange.h>
#include <models/char_gpt.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <sstream>
#include <thread>

namespace gpipe {
namespace cli {
namespace {

at::Tensor char_gpt_loss(const Batch& output, const Batch& target) {
  return models::char_gpt_loss(output.tensor(), target.tensor());
}

// The peak of each stage: what its tasks allocated on the CPU (the tracking allocator's tag is
// the stage index), or its device's.
int64_t stage_peak(int64_t stage, const c10::Device& device) {
  if (!device.is_cpu()) return memory::peak_bytes(device);
  return stage < memory::kMaxTags ? memory::cpu_peak_bytes(stage) : 0;
}

void reset_peaks(const std::vector<c10::Device>& devices) {
  memory::reset_cpu_peak();
  for (const auto& device : devices) {
    if (!device.is_cpu()) memory::reset_peak(device);
  }
}

trace::Utilization utilization_of(const std::vector<double>& begins,
                                  const std::vector<double>& ends, double busy, int64_t workers) {
  trace::Utilization result;
  if (begins.empty()) return result;
  const double span =
      *std::max_element(ends.begin(), ends.end()) - *std::min_element(begins.begin(), begins.end());
  result.available_us = static_cast<double>(workers) * span;
  result.busy_us = busy;
  return result;
}

// The loss scaler of --precision fp16, else none.
std::shared_ptr<amp::GradScaler> grad_scaler_for(const TrainConfig& c) {
  if (c.precision != "fp16") return nullptr;
  return std::make_shared<amp::GradScaler>(amp::GradScalerOptions().init_scale(c.loss_scale));
}

// Either engine's options with the schedule, stages per worker, threads, checkpointing and loss
// scaler of `c`.
template <typename Options>
Options scheduled(Options options, const TrainConfig& c,
                  const std::shared_ptr<amp::GradScaler>& scaler) {
  options.schedule(schedule::parse_schedule_kind(c.schedule))
      .stages_per_worker(c.virtual_stages)
      .intra_op_threads(c.threads)
      .checkpoint(c.checkpoint)
      .grad_scaler(scaler);
  if (c.custom_schedule) options.custom_schedule(*c.custom_schedule);
  return options;
}

// What either engine (PipelineSchedule, PipelineStage) answers alike; `engine()` is the one.
template <typename Engine>
class EnginePipeline : public TrainPipeline {
 public:
  // A traced pipeline with the loss scaler of `c`.
  explicit EnginePipeline(const TrainConfig& c)
      : TrainPipeline(std::make_shared<trace::Tracer>(), grad_scaler_for(c)) {}

  at::Tensor step(const at::Tensor& input, const at::Tensor& target) override {
    return engine().step(input, target);
  }
  at::Tensor evaluate(const at::Tensor& input, const at::Tensor& target) override {
    return engine().evaluate(input, target).loss;
  }
  double clip_grad_norm(double max_norm) override { return engine().clip_grad_norm(max_norm); }
  schedule::Schedule schedule(int64_t num_microbatches) override {
    return engine().schedule(num_microbatches);
  }
  std::vector<at::Tensor> parameters() override { return engine().parameters(); }

 protected:
  virtual Engine& engine() = 0;
};

// ---- threads ----

class ThreadPipeline final : public EnginePipeline<schedule::PipelineSchedule> {
 public:
  ThreadPipeline(const TrainConfig& c, const torch::nn::Sequential& model,
                 const std::vector<int64_t>& balance)
      : EnginePipeline(c),
        model_(model),
        devices_(c.devices.empty() ? std::vector<c10::Device>(c.stages, c10::kCPU) : c.devices),
        num_workers_(c.stages / c.virtual_stages),
        pipeline_(model, balance, char_gpt_loss,
                  scheduled(schedule::PipelineScheduleOptions(c.chunks), c, grad_scaler_)
                      .devices(c.devices)
                      .tracer(tracer_)) {
    reset_peaks(devices_);
  }

  bool reports() const override { return true; }
  std::string workers() const override {
    return std::to_string(num_workers_) + " worker thread" + (num_workers_ == 1 ? "" : "s");
  }
  std::vector<int64_t> layers() const override {
    std::vector<int64_t> all(model_->size());
    for (const auto k : c10::irange(all.size())) all[k] = static_cast<int64_t>(k);
    return all;
  }

  TrainSummary summarize() override {
    TrainSummary summary;
    summary.devices = devices_;
    for (const auto s : c10::irange(devices_.size())) {
      summary.peak_bytes.push_back(stage_peak(static_cast<int64_t>(s), devices_[s]));
    }
    for (const StepTime& t : steady_steps_) {
      summary.steady += utilization_of({t.begin_us}, {t.end_us}, t.busy_us, num_workers_);
    }
    summary.kept = std::move(kept_);
    summary.traced_tasks = traced_tasks_;
    return summary;
  }
  void gather_model() override {}  // the model's layers are the stages'

 private:
  schedule::PipelineSchedule& engine() override { return pipeline_; }

  torch::nn::Sequential model_;
  std::vector<c10::Device> devices_;
  int64_t num_workers_;
  schedule::PipelineSchedule pipeline_;
};

// ---- ranks ----

std::vector<uint8_t> bytes_of(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}
std::string text_of(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

class RankPipeline final : public EnginePipeline<distributed::PipelineStage> {
 public:
  RankPipeline(const TrainConfig& c, const torch::nn::Sequential& model,
               const std::vector<int64_t>& balance, const distributed::ProcessGroup* ranks)
      : EnginePipeline(c),
        model_(model),
        group_(ranks ? *ranks : meet_ranks(c)),
        pipeline_(group_, model, balance, char_gpt_loss,
                  scheduled(distributed::PipelineStageOptions(c.chunks), c, grad_scaler_)
                      .receive_window(c.receive_window)
                      .device(c.devices.empty() ? c10::Device(c10::kCPU) : c.devices[c.ranks->rank])
                      .tracer(tracer_)) {
    first_layer_.assign(balance.size() + 1, 0);
    for (const auto s : c10::irange(balance.size())) {
      first_layer_[s + 1] = first_layer_[s] + balance[s];
    }
    reset_peaks({pipeline_.device()});
  }

  bool reports() const override { return pipeline_.rank() == 0; }
  std::string workers() const override { return std::to_string(pipeline_.world_size()) + " ranks"; }
  int64_t rank() const override { return pipeline_.rank(); }
  int64_t world_size() const override { return pipeline_.world_size(); }
  std::vector<int64_t> layers() const override {
    std::vector<int64_t> result;
    for (const int64_t s : pipeline_.stage_indices()) {
      for (int64_t k = first_layer_[s]; k < first_layer_[s + 1]; ++k) result.push_back(k);
    }
    return result;
  }
  void barrier(const std::string& name) override {
    const std::string counter = "gpipe/train/barrier/" + name;
    group_.store->add(counter, 1);
    const auto timeout = distributed::PipelineStageOptions(1).timeout();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (group_.store->add(counter, 0) < world_size()) {
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "rank ", rank(), " waited ",
                  timeout.count() / 1000, " s for the other ranks at ", name);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::string broadcast(const std::string& name, const std::string& value) override {
    const std::string key = "gpipe/train/broadcast/" + name;
    if (rank() == 0) {
      group_.store->set(key, bytes_of(value));
      return value;
    }
    return text_of(group_.store->get(key));
  }

  TrainSummary summarize() override {
    // Each rank says its stages' peaks, its steps' times and its kept events, on the ranks'
    // timeline (its tracer joined it), and how exactly its clock is aligned; rank 0 reads them.
    std::ostringstream mine;
    mine.precision(std::numeric_limits<double>::max_digits10);
    mine << "traced " << traced_tasks_ << " " << tracer_->clock_uncertainty_us() << "\n";
    for (const int64_t s : pipeline_.stage_indices()) {
      mine << "peak " << s << " " << stage_peak(s, pipeline_.device()) << " " << pipeline_.device()
           << "\n";
    }
    for (const StepTime& t : steady_steps_) {
      mine << "step " << t.begin_us << " " << t.end_us << " " << t.busy_us << "\n";
    }
    for (const trace::Event& e : kept_) {
      mine << "event " << e.name << " " << e.rank << " " << e.worker << " " << e.stage << " "
           << e.microbatch << " " << e.step << " " << e.begin_us << " " << e.end_us << "\n";
    }
    TrainSummary summary;
    if (!reports()) {
      group_.store->set(key("summary", pipeline_.rank()), bytes_of(mine.str()));
      return summary;
    }
    const int64_t stages = pipeline_.num_stages();
    summary.peak_bytes.assign(stages, 0);
    summary.devices.assign(stages, c10::Device(c10::kCPU));
    std::vector<std::vector<double>> begins(steady_steps_.size()), ends(steady_steps_.size());
    std::vector<double> busy(steady_steps_.size(), 0);
    for (const auto r : c10::irange(pipeline_.world_size())) {
      std::istringstream in(r == 0 ? mine.str() : text_of(group_.store->get(key("summary", r))));
      size_t step = 0;
      for (std::string kind; in >> kind;) {
        if (kind == "traced") {
          int64_t count = 0;
          double uncertainty_us = 0;
          in >> count >> uncertainty_us;
          summary.traced_tasks += count;
          summary.clock_uncertainty_us = std::max(summary.clock_uncertainty_us, uncertainty_us);
        } else if (kind == "peak") {
          int64_t s = 0, bytes = 0;
          std::string device;
          in >> s >> bytes >> device;
          summary.peak_bytes[s] = bytes;
          summary.devices[s] = c10::Device(device);
        } else if (kind == "step") {
          double begin = 0, end = 0, busy_us = 0;
          in >> begin >> end >> busy_us;
          if (step < begins.size()) {
            begins[step].push_back(begin);
            ends[step].push_back(end);
            busy[step] += busy_us;
          }
          ++step;
        } else {
          trace::Event e;
          in >> e.name >> e.rank >> e.worker >> e.stage >> e.microbatch >> e.step >> e.begin_us >>
              e.end_us;
          summary.kept.push_back(std::move(e));
        }
      }
    }
    for (const auto k : c10::irange(begins.size())) {
      summary.steady += utilization_of(begins[k], ends[k], busy[k], pipeline_.world_size());
    }
    std::stable_sort(
        summary.kept.begin(), summary.kept.end(),
        [](const trace::Event& a, const trace::Event& b) { return a.begin_us < b.begin_us; });
    return summary;
  }

  void gather_model() override {
    // Each rank sends its stages' parameters and buffers; rank 0 copies them into its model.
    const auto tensors_of = [&](int64_t s) {
      std::vector<at::Tensor> tensors;
      for (int64_t layer = first_layer_[s]; layer < first_layer_[s + 1]; ++layer) {
        for (const auto& p : model_->ptr(layer)->parameters()) tensors.push_back(p);
        for (const auto& b : model_->ptr(layer)->buffers()) tensors.push_back(b);
      }
      return tensors;
    };
    if (!reports()) {
      for (const int64_t s : pipeline_.stage_indices()) {
        std::ostringstream out;
        std::vector<at::Tensor> tensors;
        for (const auto& t : tensors_of(s)) tensors.push_back(t.detach().cpu());
        torch::save(tensors, out);
        group_.store->set(key("stage", s), bytes_of(out.str()));
      }
      return;
    }
    const auto mine = pipeline_.stage_indices();
    torch::NoGradGuard no_grad;
    for (const auto s : c10::irange(pipeline_.num_stages())) {
      if (std::find(mine.begin(), mine.end(), s) != mine.end()) continue;
      std::istringstream in(text_of(group_.store->get(key("stage", s))));
      std::vector<at::Tensor> received;
      torch::load(received, in);
      auto tensors = tensors_of(s);
      TORCH_CHECK(received.size() == tensors.size(), "stage ", s, " sent ", received.size(),
                  " tensors for ", tensors.size());
      for (const auto k : c10::irange(tensors.size())) tensors[k].copy_(received[k]);
    }
  }

 private:
  distributed::PipelineStage& engine() override { return pipeline_; }

  static std::string key(const char* what, int64_t index) {
    return std::string("gpipe/train/") + what + "/" + std::to_string(index);
  }

  torch::nn::Sequential model_;
  std::vector<int64_t> first_layer_;  // of each stage, and the layer count last
  distributed::ProcessGroup group_;
  distributed::PipelineStage pipeline_;
};

}  // namespace

distributed::ProcessGroup meet_ranks(const TrainConfig& config) {
  TORCH_INTERNAL_ASSERT(config.ranks, "meet_ranks without ranks");
  return distributed::rendezvous(
      *config.ranks, distributed::PipelineStageOptions(config.chunks).rendezvous_timeout());
}

std::unique_ptr<TrainPipeline> TrainPipeline::make(const TrainConfig& config,
                                                   const torch::nn::Sequential& model,
                                                   const std::vector<int64_t>& balance,
                                                   const distributed::ProcessGroup* ranks) {
  if (config.ranks) return std::make_unique<RankPipeline>(config, model, balance, ranks);
  return std::make_unique<ThreadPipeline>(config, model, balance);
}

void TrainPipeline::record_step(bool steady, bool keep) {
  std::vector<trace::Event> events = tracer_->events();
  tracer_->clear();
  if (steady && !events.empty()) {
    StepTime t{std::numeric_limits<double>::max(), std::numeric_limits<double>::lowest(), 0};
    for (const auto& e : events) {
      t.begin_us = std::min(t.begin_us, e.begin_us);
      t.end_us = std::max(t.end_us, e.end_us);
      if (trace::is_compute(e)) t.busy_us += e.end_us - e.begin_us;
    }
    steady_steps_.push_back(t);
  }
  traced_tasks_ += static_cast<int64_t>(events.size());
  if (keep) kept_.insert(kept_.end(), events.begin(), events.end());
}

}  // namespace cli
}  // namespace gpipe

#include "train.h"

#include "model_file.h"
#include "progress.h"

#include <gpipe/balance/balance.h>
#include <gpipe/memory.h>
#include <gpipe/schedule/runtime.h>
#include <gpipe/trace.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

namespace gpipe {
namespace cli {
namespace {

std::vector<c10::Device> parse_devices(const std::string& list) {
  std::vector<c10::Device> devices;
  std::stringstream in(list);
  std::string name;
  while (std::getline(in, name, ',')) {
    try {
      devices.emplace_back(name);
    } catch (const c10::Error&) {
      throw UsageError("--devices: '" + name + "' is not a device (e.g. cpu, cuda:0)");
    }
  }
  if (devices.empty()) throw UsageError("--devices needs at least one device");
  for (const auto& device : devices) {
    const std::string text = device.str();
    if (!device.is_cpu() && !device.is_cuda()) {
      throw UsageError("--devices: '" + text + "' is not a cpu or cuda device");
    }
    if (!device.is_cuda()) continue;
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    if (count == 0) {
      throw UsageError("--devices: '" + text +
                       "' does not exist (this machine has no CUDA device)");
    }
    if (device.index() >= count) {
      throw UsageError("--devices: '" + text + "' does not exist (this machine has " +
                       std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") + ")");
    }
  }
  return devices;
}

std::string mib(int64_t bytes) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buffer;
}

void write_file(const std::string& path, const std::function<void(std::ostream&)>& write) {
  std::ofstream out(path);
  if (!out) throw UsageError("cannot write '" + path + "'");
  write(out);
  if (!out) throw UsageError("cannot write '" + path + "'");
}

}  // namespace

std::string train_usage() {
  return R"(usage: gpipe train [flags]

Trains a character-level GPT on text, pipelined over stages, and reports throughput, peak
memory per stage and the measured pipeline bubble.

data and model:
  --data FILE[,FILE...]   text to train on; a directory means its files
                          (default: /usr/share/common-licenses)
  --layers N              transformer blocks (default 4); the model has N + 2 layers
  --embedding-dim N       width (default 128)      --heads N        attention heads (default 4)
  --block-size N          context in bytes (default 64)
  --load FILE             start from a model saved with --save (its sizes win)
  --save FILE             save the trained model (for gpipe generate)
training:
  --steps N               optimizer steps (default 300)
  --batch-size N          samples per step (default 32)
  --lr X                  AdamW learning rate (default 0.002)
  --seed N                for weights and batches (default 0)
pipeline:
  --stages N              pipeline stages (default 2)
  --chunks N              micro-batches per step (default 4)
  --schedule NAME         gpipe | 1f1b | interleaved_1f1b | zb1p (default 1f1b)
  --virtual-stages N      stages per worker for interleaved_1f1b (default 1)
  --checkpoint MODE       never | always | except_last (default never)
  --threads N             intra-op threads per stage (default 1)
  --devices D[,D...]      device of each stage (default: all cpu)
output:
  --trace FILE            Chrome/Perfetto trace (JSON) of every task
  --timeline FILE         SVG picture of the last --timeline-steps N steps (default 2)
  --quiet                 print nothing: no progress line, no summary
)";
}

TrainConfig parse_train_config(const std::vector<std::string>& args) {
  Arguments a(args);
  TrainConfig c;
  if (auto data = a.text("data")) {
    c.data.clear();
    std::stringstream in(*data);
    std::string path;
    while (std::getline(in, path, ',')) c.data.push_back(path);
    if (c.data.empty()) throw UsageError("--data needs at least one file");
  }
  for (const auto& path : c.data) {
    std::error_code error;
    if (!std::filesystem::exists(path, error)) {
      throw UsageError("data file '" + path + "' does not exist or is not a file");
    }
  }
  c.load = a.text("load", "");
  for (const char* shape : {"layers", "embedding-dim", "heads", "block-size"}) {
    if (!c.load.empty() && a.has(shape)) {
      throw UsageError(std::string("--") + shape +
                       " cannot change a model read with --load (its sizes are saved with it)");
    }
  }
  c.model.num_layers(a.integer("layers", c.model.num_layers(), 1))
      .embedding_dim(a.integer("embedding-dim", c.model.embedding_dim(), 1))
      .num_heads(a.integer("heads", c.model.num_heads(), 1))
      .block_size(a.integer("block-size", c.model.block_size(), 1));
  if (c.model.embedding_dim() % c.model.num_heads() != 0) {
    throw UsageError("--heads " + std::to_string(c.model.num_heads()) +
                     " must divide --embedding-dim " + std::to_string(c.model.embedding_dim()));
  }
  c.save = a.text("save", "");
  c.steps = a.integer("steps", c.steps, 1);
  c.batch_size = a.integer("batch-size", c.batch_size, 1);
  c.learning_rate = a.real("lr", c.learning_rate, 0);
  c.seed = a.integer("seed", c.seed, 0);
  c.stages = a.integer("stages", c.stages, 1);
  c.chunks = a.integer("chunks", c.chunks, 1);
  c.schedule = a.choice("schedule", c.schedule, schedule::schedule_names());
  c.virtual_stages = a.integer("virtual-stages", c.virtual_stages, 1);
  c.checkpoint =
      parse_checkpoint_mode(a.choice("checkpoint", "never", {"never", "always", "except_last"}));
  c.threads = a.integer("threads", c.threads, 1);
  if (auto devices = a.text("devices")) c.devices = parse_devices(*devices);
  c.trace = a.text("trace", "");
  c.timeline = a.text("timeline", "");
  c.timeline_steps = a.integer("timeline-steps", c.timeline_steps, 1);
  c.quiet = a.flag("quiet");
  a.finish();

  // Every output is checked now, so that a bad path never costs a whole run.
  if (!c.save.empty()) check_output_path("--save", c.save);
  if (!c.trace.empty()) check_output_path("--trace", c.trace);
  if (!c.timeline.empty()) check_output_path("--timeline", c.timeline);

  // A loaded model's layer count is known only once it is read: train() checks it again.
  const int64_t layers = c.model.num_layers() + 2;
  if (c.load.empty() && c.stages > layers) {
    throw UsageError("--stages " + std::to_string(c.stages) + " is more than the model's " +
                     std::to_string(layers) + " layers (--layers " +
                     std::to_string(c.model.num_layers()) + " blocks + embedding + head)");
  }
  if (c.stages % c.virtual_stages != 0) {
    throw UsageError("--virtual-stages " + std::to_string(c.virtual_stages) +
                     " must divide --stages " + std::to_string(c.stages));
  }
  try {
    schedule::ScheduleOptionNames names;
    names.schedule = "--schedule";
    names.stages_per_worker = "--virtual-stages";
    names.checkpoint = "--checkpoint";
    schedule::check_schedule_options(schedule::parse_schedule_kind(c.schedule), c.virtual_stages,
                                     c.checkpoint, names);
  } catch (const c10::ValueError& error) {
    throw UsageError(error.what_without_backtrace());
  }
  if (!c.devices.empty() && static_cast<int64_t>(c.devices.size()) != c.stages) {
    throw UsageError("--devices names " + std::to_string(c.devices.size()) +
                     " devices for --stages " + std::to_string(c.stages));
  }
  return c;
}

TrainReport train(const TrainConfig& c, std::ostream& out, bool interactive) {
  memory::install_tracking_cpu_allocator();
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  models::CharGPTOptions options = c.model;
  torch::nn::Sequential model;
  if (!c.load.empty()) {
    SavedModel saved = load_model(c.load);
    options = saved.options;
    model = saved.model;
  } else {
    model = models::char_gpt(options);
  }
  const int64_t layers = static_cast<int64_t>(model->size());
  if (c.stages > layers) {
    throw UsageError("--stages " + std::to_string(c.stages) + " is more than the model's " +
                     std::to_string(layers) + " layers");
  }
  const TextCorpus corpus = TextCorpus::load(c.data, options.block_size() + 1);
  const auto balance = balance::balance_by_count(c.stages, layers);
  auto tracer = std::make_shared<trace::Tracer>();
  auto pipeline_options = schedule::PipelineScheduleOptions(c.chunks)
                              .schedule(schedule::parse_schedule_kind(c.schedule))
                              .stages_per_worker(c.virtual_stages)
                              .intra_op_threads(c.threads)
                              .checkpoint(c.checkpoint)
                              .devices(c.devices)
                              .tracer(tracer);
  schedule::PipelineSchedule pipeline(
      model, balance,
      [](const Batch& output, const Batch& target) {
        return models::char_gpt_loss(output.tensor(), target.tensor());
      },
      pipeline_options);
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(c.learning_rate).weight_decay(0.01));

  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  std::string balance_text;
  for (const auto b : balance)
    balance_text += (balance_text.empty() ? "" : ",") + std::to_string(b);
  out << "gpipe train: char GPT (" << options.num_layers() << " blocks, width "
      << options.embedding_dim() << ", " << parameters << " parameters) on " << corpus.size()
      << " bytes from " << corpus.num_files() << " files\n"
      << "  " << c.stages << " stages [" << balance_text << "], " << c.chunks
      << " micro-batches, schedule " << c.schedule << ", checkpoint " << c.checkpoint << ", batch "
      << c.batch_size << " x " << options.block_size() << " bytes, " << c.steps << " steps\n";

  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.seed) + 1);
  ProgressBar progress(out, c.steps, c.batch_size, interactive);
  TrainReport report;
  // A CPU stage's peak counts what its tasks allocate (the tracking allocator's tags); a CUDA
  // stage's is its device's (the caching allocator's), shared by the stages on that device.
  const std::vector<c10::Device> stage_devices =
      c.devices.empty() ? std::vector<c10::Device>(c.stages, c10::Device(c10::kCPU)) : c.devices;
  memory::reset_cpu_peak();
  for (const auto& device : stage_devices) {
    if (!device.is_cpu()) memory::reset_peak(device);
  }
  // Each step's events are drained as it ends: the bubble adds up step by step, and only what
  // --trace or --timeline will write is kept, so a long run does not pile up events.
  trace::Utilization steady;  // the first step warms up allocators and threads: left out
  std::vector<trace::Event> kept;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= c.steps; ++step) {
    auto [input, target] = corpus.batch(c.batch_size, options.block_size(), generator);
    optimizer.zero_grad();
    const double loss = pipeline.step(input, target).item<double>();
    optimizer.step();
    report.losses.push_back(loss);
    progress.update(step, loss);

    std::vector<trace::Event> events = tracer->events();
    tracer->clear();
    report.traced_tasks += static_cast<int64_t>(events.size());
    if (c.steps == 1 || step > 1) steady += trace::utilization(events);
    const bool drawn = !c.timeline.empty() && step > c.steps - c.timeline_steps;
    if (!c.trace.empty() || drawn) kept.insert(kept.end(), events.begin(), events.end());
  }
  progress.finish();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.samples_per_second = static_cast<double>(c.steps * c.batch_size) / report.seconds;
  for (int64_t s = 0; s < c.stages && s < memory::kMaxTags; ++s) {
    const c10::Device& device = stage_devices[s];
    report.peak_bytes_per_stage.push_back(device.is_cpu() ? memory::cpu_peak_bytes(s)
                                                          : memory::peak_bytes(device));
  }

  report.bubble_fraction = steady.bubble_fraction();
  const int64_t M = std::min(c.chunks, c.batch_size);
  const int64_t workers = c.stages / c.virtual_stages;
  report.bubble_bound =
      static_cast<double>(workers - 1) / static_cast<double>(M * c.virtual_stages + workers - 1);

  if (!c.trace.empty()) {
    write_file(c.trace, [&](std::ostream& o) { trace::write_chrome_trace(kept, o); });
  }
  if (!c.timeline.empty()) {
    std::vector<trace::Event> last;
    for (const auto& e : kept) {
      if (e.step >= c.steps - c.timeline_steps) last.push_back(e);
    }
    write_file(c.timeline, [&](std::ostream& o) { trace::write_svg_timeline(last, o); });
  }
  if (!c.save.empty()) save_model(c.save, model, options);

  const auto average = [&](size_t from, size_t to) {
    double sum = 0;
    for (size_t k = from; k < to; ++k) sum += report.losses[k];
    return sum / static_cast<double>(to - from);
  };
  const size_t n = report.losses.size();
  const size_t window = std::max<size_t>(1, std::min<size_t>(10, n / 2));
  char line[256];
  std::snprintf(line, sizeof(line),
                "done: %lld steps in %.1f s, %.0f samples/s (%.0f tokens/s); loss %.3f -> %.3f "
                "(mean of first and last %zu steps)\n",
                static_cast<long long>(c.steps), report.seconds, report.samples_per_second,
                report.samples_per_second * static_cast<double>(options.block_size()),
                average(0, window), average(n - window, n), window);
  out << line << "peak memory per stage (allocated by its tasks; on a GPU, by its device):";
  for (size_t s = 0; s < report.peak_bytes_per_stage.size(); ++s) {
    out << (s ? "," : "") << " stage " << s << " " << mib(report.peak_bytes_per_stage[s]);
    if (!stage_devices[s].is_cpu()) out << " (" << stage_devices[s] << ")";
  }
  std::snprintf(line, sizeof(line),
                "\nbubble: %.1f%% of worker time idle (%s bound %.1f%%); %lld tasks traced\n",
                100 * report.bubble_fraction, c.schedule == "zb1p" ? "1F1B's" : "schedule",
                100 * report.bubble_bound, static_cast<long long>(report.traced_tasks));
  out << line;
  if (!c.trace.empty()) out << "trace: " << c.trace << "\n";
  if (!c.timeline.empty()) out << "timeline: " << c.timeline << "\n";
  if (!c.save.empty()) out << "model: " << c.save << "\n";
  return report;
}

}  // namespace cli
}  // namespace gpipe

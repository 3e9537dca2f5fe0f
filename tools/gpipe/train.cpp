#include "train.h"

#include "model_file.h"
#include "progress.h"
#include "train_pipeline.h"
#include "train_snapshot.h"

#include <gpipe/balance/balance.h>
#include <gpipe/memory.h>
#include <gpipe/schedule/predict.h>
#include <gpipe/schedule/runtime.h>
#include <gpipe/schedule/schedule_file.h>
#include <gpipe/trace.h>

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <type_traits>

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

// The snapshots' folder exists, or is made now; on ranks, on every machine.
void check_snapshot_dir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    throw UsageError("--snapshot-dir '" + dir +
                     "': " + (error ? "cannot make it: " + error.message() : "not a folder"));
  }
}

// Where the flags land before parse_train_config() checks them together.
// Their defaults are the config's and the model's own.
struct TrainFlags {
  TrainConfig config;
  std::string data = kDefaultCorpusDirectory;
  int64_t layers = config.model.num_layers();
  int64_t embedding_dim = config.model.embedding_dim();
  int64_t heads = config.model.num_heads();
  int64_t block_size = config.model.block_size();
  std::string checkpoint = c10::str(config.checkpoint);
  std::string devices;
};

std::unique_ptr<CLI::App> train_command_line(TrainFlags& f) {
  TrainConfig& c = f.config;
  auto app = command_line("gpipe train [flags]",
                          "Trains a character-level GPT on text, pipelined over stages, and "
                          "reports\nthroughput, peak memory per stage and the measured pipeline "
                          "bubble.");
  const auto option = [&](const char* group, const std::string& name, auto& value,
                          const std::string& help) {
    CLI::Option* added = app->add_option(name, value, help)->group(group);
    using Value = std::decay_t<decltype(value)>;
    if constexpr (std::is_integral_v<Value>) added->type_name("N");
    if constexpr (std::is_floating_point_v<Value>) added->type_name("X");
    return added;
  };
  const char* data = "data and model";
  option(data, "--data", f.data, "text to train on, FILE[,FILE...]; a folder: its files")
      ->type_name("FILE");
  option(data, "--layers", f.layers, "transformer blocks; the model has N + 2 layers")
      ->check(at_least(1));
  option(data, "--embedding-dim", f.embedding_dim, "width")->check(at_least(1));
  option(data, "--heads", f.heads, "attention heads")->check(at_least(1));
  option(data, "--block-size", f.block_size, "context in bytes")->check(at_least(1));
  option(data, "--load", c.load, "start from a model saved with --save (its sizes win)")
      ->type_name("FILE");
  option(data, "--save", c.save, "save the trained model (for gpipe generate)")->type_name("FILE");
  const char* training = "training";
  option(training, "--steps", c.steps, "optimizer steps")->check(at_least(1));
  option(training, "--batch-size", c.batch_size, "samples per step")->check(at_least(1));
  option(training, "--lr", c.learning_rate, "AdamW learning rate")->check(greater_than(0));
  option(training, "--seed", c.seed, "for weights and batches")->check(at_least(0));
  const char* pipeline = "pipeline";
  option(pipeline, "--stages", c.stages,
         "pipeline stages (on ranks: WORLD_SIZE x --virtual-stages)")
      ->check(at_least(1));
  option(pipeline, "--chunks", c.chunks, "micro-batches per step")->check(at_least(1));
  option(pipeline, "--schedule", c.schedule, listed(schedule::schedule_names()))
      ->type_name("NAME")
      ->check(one_of(schedule::schedule_names()));
  option(pipeline, "--virtual-stages", c.virtual_stages,
         "stages per worker: any for interleaved_1f1b, interleaved_zb1p and looped_bfs, 2 for "
         "zbv")
      ->check(at_least(1));
  app->add_flag("--simulate", c.simulate,
                "train nothing: profile the model and predict a step of every schedule it allows "
                "(gpipe/schedule/predict.h)")
      ->group(pipeline);
  option(pipeline, "--memory-budget", c.memory_budget_mib,
         "with --simulate: the activations one worker may hold, in MiB (0: any)")
      ->type_name("MIB")
      ->check(CLI::NonNegativeNumber);
  option(pipeline, "--schedule-file", c.schedule_file,
         "a schedule of one's own (docs/schedules.md), instead of --schedule; its stages and "
         "micro-batches are --stages and --chunks")
      ->type_name("FILE");
  const std::vector<std::string> modes = {"never", "always", "except_last"};
  option(pipeline, "--checkpoint", f.checkpoint, listed(modes) + ": what backward recomputes")
      ->type_name("MODE")
      ->check(one_of(modes));
  option(pipeline, "--threads", c.threads, "intra-op threads per stage")->check(at_least(1));
  option(pipeline, "--devices", f.devices,
         "device of each stage (on ranks: of each rank): D[,D...] (default: all cpu)")
      ->type_name("D");
  const char* output = "output";
  option(output, "--trace", c.trace, "Chrome/Perfetto trace (JSON) of every task")
      ->type_name("FILE");
  option(output, "--timeline", c.timeline, "SVG picture of the last --timeline-steps steps")
      ->type_name("FILE");
  option(output, "--timeline-steps", c.timeline_steps, "steps the timeline draws")
      ->check(at_least(1));
  app->add_flag("--quiet", c.quiet, "print nothing: no progress line, no summary")->group(output);
  const char* snapshots = "snapshots of training, to resume from (on threads and on ranks)";
  option(snapshots, "--save-every", c.save_every, "save a snapshot every N steps")
      ->default_str("never")
      ->check(at_least(1));
  option(snapshots, "--snapshot-dir", c.snapshot_dir, "the snapshots' folder")->type_name("DIR");
  app->add_flag("--resume", c.resume,
                "continue from the last snapshot in --snapshot-dir (none: from the start)")
      ->group(snapshots);
  return app;
}

// Reads --schedule-file into c.custom_schedule; its stages and micro-batches become --stages and
// --chunks, which may be given only with the same values.
void read_schedule_file(const CLI::App& app, TrainConfig& c) {
  if (app.count("--schedule") > 0 || app.count("--virtual-stages") > 0) {
    throw UsageError("--schedule-file replaces --schedule and --virtual-stages");
  }
  try {
    c.custom_schedule = schedule::read_schedule_file(c.schedule_file);
  } catch (const c10::ValueError& error) {
    throw UsageError(error.what_without_backtrace());
  }
  const schedule::Schedule& file = *c.custom_schedule;
  const auto adopt = [&](const char* flag, int64_t& value, int64_t in_file, const char* what) {
    if (app.count(flag) == 0) value = in_file;
    if (value != in_file) {
      throw UsageError(std::string(flag) + " " + std::to_string(value) + " does not match the " +
                       std::to_string(in_file) + " " + what + " of --schedule-file " +
                       c.schedule_file);
    }
  };
  adopt("--stages", c.stages, file.num_stages, "stages");
  adopt("--chunks", c.chunks, file.num_microbatches, "micro-batches");
  c.virtual_stages = file.num_stages / file.num_workers;
  if (c.batch_size < c.chunks) {
    throw UsageError("--batch-size " + std::to_string(c.batch_size) + " makes fewer than the " +
                     std::to_string(c.chunks) + " micro-batches of --schedule-file " +
                     c.schedule_file);
  }
  if (c.ranks && c.ranks->world_size != file.num_workers) {
    throw UsageError("--schedule-file " + c.schedule_file + " has " +
                     std::to_string(file.num_workers) + " workers, but there are " +
                     std::to_string(c.ranks->world_size) + " ranks");
  }
}

}  // namespace

std::string schedule_name(const TrainConfig& c) {
  return c.schedule_file.empty() ? c.schedule : "file " + c.schedule_file;
}

std::string train_usage() {
  TrainFlags flags;
  return train_command_line(flags)->help();
}

TrainConfig parse_train_config(const std::vector<std::string>& args) {
  TrainFlags f;
  const auto app = train_command_line(f);
  parse(*app, args);
  TrainConfig c = f.config;
  c.data.clear();
  std::stringstream data(f.data);
  for (std::string path; std::getline(data, path, ',');) c.data.push_back(path);
  if (c.data.empty()) throw UsageError("--data needs at least one file");
  for (const auto& path : c.data) {
    std::error_code error;
    if (!std::filesystem::exists(path, error)) {
      throw UsageError("data file '" + path + "' does not exist or is not a file");
    }
  }
  for (const char* shape : {"--layers", "--embedding-dim", "--heads", "--block-size"}) {
    if (!c.load.empty() && app->count(shape) > 0) {
      throw UsageError(std::string(shape) +
                       " cannot change a model read with --load (its sizes are saved with it)");
    }
  }
  c.model.num_layers(f.layers)
      .embedding_dim(f.embedding_dim)
      .num_heads(f.heads)
      .block_size(f.block_size);
  if (c.model.embedding_dim() % c.model.num_heads() != 0) {
    throw UsageError("--heads " + std::to_string(c.model.num_heads()) +
                     " must divide --embedding-dim " + std::to_string(c.model.embedding_dim()));
  }
  c.checkpoint = parse_checkpoint_mode(f.checkpoint);
  if (app->count("--devices") > 0) c.devices = parse_devices(f.devices);
  if (std::getenv("WORLD_SIZE") != nullptr) {
    try {
      c.ranks = distributed::read_environment();
    } catch (const c10::ValueError& error) {
      throw UsageError(error.what_without_backtrace());
    }
  }

  if ((c.save_every > 0 || c.resume) && c.snapshot_dir.empty()) {
    throw UsageError(std::string(c.resume ? "--resume" : "--save-every") +
                     " needs --snapshot-dir DIR");
  }
  if (!c.snapshot_dir.empty() && c.save_every == 0 && !c.resume) {
    throw UsageError("--snapshot-dir needs --save-every N or --resume");
  }
  if (c.save_every > 0) check_snapshot_dir(c.snapshot_dir);

  // Every output is checked now, so that a bad path never costs a whole run; on ranks, rank 0
  // writes them.
  if (!c.ranks || c.ranks->rank == 0) {
    if (!c.save.empty()) check_output_path("--save", c.save);
    if (!c.trace.empty()) check_output_path("--trace", c.trace);
    if (!c.timeline.empty()) check_output_path("--timeline", c.timeline);
  }

  if (!c.schedule_file.empty()) read_schedule_file(*app, c);

  if (c.ranks) {
    // One worker per rank.
    const int64_t stages = c.ranks->world_size * c.virtual_stages;
    if (app->count("--stages") == 0) c.stages = stages;
    if (c.stages != stages) {
      throw UsageError("--stages " + std::to_string(c.stages) + " does not match " +
                       std::to_string(c.ranks->world_size) + " ranks x --virtual-stages " +
                       std::to_string(c.virtual_stages) + " = " + std::to_string(stages));
    }
    if (!c.devices.empty() && static_cast<int64_t>(c.devices.size()) != c.ranks->world_size) {
      throw UsageError("--devices names " + std::to_string(c.devices.size()) + " devices for " +
                       std::to_string(c.ranks->world_size) + " ranks (one per rank)");
    }
  }

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
    if (!c.custom_schedule) {
      const schedule::ScheduleKind kind = schedule::parse_schedule_kind(c.schedule);
      schedule::check_schedule_options(kind, c.virtual_stages, c.checkpoint, names);
      const int64_t least = schedule::min_microbatches(kind, c.stages);
      if (std::min(c.chunks, c.batch_size) < least) {
        throw UsageError("--schedule " + c.schedule + " needs at least " + std::to_string(least) +
                         " micro-batches for --stages " + std::to_string(c.stages) +
                         ", but --chunks is " + std::to_string(c.chunks) + " and --batch-size " +
                         std::to_string(c.batch_size));
      }
    }
  } catch (const c10::ValueError& error) {
    throw UsageError(error.what_without_backtrace());
  }
  if (c.custom_schedule && c.checkpoint != CheckpointMode::kNever &&
      schedule::splits_backward(*c.custom_schedule)) {
    throw UsageError("--schedule-file " + c.schedule_file +
                     " splits backwards into input and weight gradients, which --checkpoint "
                     "cannot");
  }
  if (!c.ranks && !c.devices.empty() && static_cast<int64_t>(c.devices.size()) != c.stages) {
    throw UsageError("--devices names " + std::to_string(c.devices.size()) +
                     " devices for --stages " + std::to_string(c.stages));
  }
  return c;
}

torch::nn::Sequential make_model(const TrainConfig& c, models::CharGPTOptions& options) {
  if (c.load.empty()) {
    options = c.model;
    return models::char_gpt(options);
  }
  SavedModel saved = load_model(c.load);
  options = saved.options;
  return saved.model;
}

TrainReport train(const TrainConfig& c, std::ostream& out, bool interactive) {
  memory::install_tracking_cpu_allocator();
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  models::CharGPTOptions options;
  torch::nn::Sequential model = make_model(c, options);
  const int64_t layers = static_cast<int64_t>(model->size());
  if (c.stages > layers) {
    throw UsageError("--stages " + std::to_string(c.stages) + " is more than the model's " +
                     std::to_string(layers) + " layers");
  }
  const TextCorpus corpus = TextCorpus::load(c.data, options.block_size() + 1);
  const auto balance = balance::balance_by_count(c.stages, layers);
  // Every rank builds the whole model from the seed and trains its own stages.
  const auto pipeline = TrainPipeline::make(c, model, balance);
  torch::optim::AdamW optimizer(pipeline->parameters(),
                                torch::optim::AdamWOptions(c.learning_rate).weight_decay(0.01));
  // Every rank draws the same batches.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.seed) + 1);
  const Manifest manifest = make_manifest(c, options, balance, *pipeline);
  int64_t first = 1;
  if (c.resume) {
    first = resume_snapshot(c.snapshot_dir, manifest, *pipeline, model, optimizer, generator) + 1;
  }
  std::ostringstream elsewhere;  // what the ranks other than rank 0 would print
  std::ostream& shown = pipeline->reports() ? out : elsewhere;

  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  std::string balance_text;
  for (const auto b : balance)
    balance_text += (balance_text.empty() ? "" : ",") + std::to_string(b);
  shown << "gpipe train: char GPT (" << options.num_layers() << " blocks, width "
        << options.embedding_dim() << ", " << parameters << " parameters) on " << corpus.size()
        << " bytes from " << corpus.num_files() << " files\n"
        << "  " << c.stages << " stages [" << balance_text << "] on " << pipeline->workers() << ", "
        << c.chunks << " micro-batches, schedule " << schedule_name(c) << ", checkpoint "
        << c.checkpoint << ", batch " << c.batch_size << " x " << options.block_size() << " bytes, "
        << c.steps << " steps\n";
  if (first > 1)
    shown << "  resumed after step " << first - 1 << " from " << c.snapshot_dir << "\n";

  ProgressBar progress(shown, c.steps, c.batch_size, interactive && pipeline->reports(), first);
  TrainReport report;
  report.resumed_step = first - 1;
  std::vector<SaveCost> saves;
  // Each step's events are drained as it ends: the bubble adds up step by step, and only what
  // --trace or --timeline will write is kept, so a long run does not pile up events. The first
  // step warms up allocators and threads: the bubble leaves it out.
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = first; step <= c.steps; ++step) {
    auto [input, target] = corpus.batch(c.batch_size, options.block_size(), generator);
    optimizer.zero_grad();
    const double loss = pipeline->step(input, target).item<double>();
    optimizer.step();
    report.losses.push_back(loss);
    progress.update(step, loss);
    const bool drawn = !c.timeline.empty() && step > c.steps - c.timeline_steps;
    pipeline->record_step(/*steady=*/c.steps == first || step > first, !c.trace.empty() || drawn);
    if (c.save_every > 0 && step % c.save_every == 0) {
      saves.push_back(
          save_snapshot(c.snapshot_dir, step, manifest, *pipeline, model, optimizer, generator));
    }
  }
  progress.finish();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto steps_run = static_cast<int64_t>(report.losses.size());
  report.samples_per_second = static_cast<double>(steps_run * c.batch_size) / report.seconds;
  TrainSummary summary = pipeline->summarize();
  if (!c.save.empty()) pipeline->gather_model();
  if (!pipeline->reports()) return report;
  report.peak_bytes_per_stage = summary.peak_bytes;
  report.traced_tasks = summary.traced_tasks;
  const std::vector<trace::Event>& kept = summary.kept;

  report.bubble_fraction = summary.steady.bubble_fraction();
  // The bubble of the schedule itself: predicted with equal stages and free messages. For GPipe
  // and (interleaved) 1F1B that is (W - 1) / (M v + W - 1).
  report.bubble_bound = schedule::predict(pipeline->schedule(std::min(c.chunks, c.batch_size)),
                                          schedule::ActionCosts::unit(c.stages))
                            .bubble_fraction;

  if (!c.trace.empty()) {
    write_file(c.trace, [&](std::ostream& o) { trace::write_chrome_trace(kept, o); });
  }
  if (!c.timeline.empty()) {
    std::vector<trace::Event> last;
    for (const auto& e : kept) {
      if (e.step >= steps_run - c.timeline_steps) last.push_back(e);  // e.step counts from 0
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
  if (n == 0) {
    std::snprintf(line, sizeof(line), "done: no steps left after step %lld\n",
                  static_cast<long long>(first - 1));
  } else {
    std::snprintf(line, sizeof(line),
                  "done: %lld steps in %.1f s, %.0f samples/s (%.0f tokens/s); loss %.3f -> %.3f "
                  "(mean of first and last %zu steps)\n",
                  static_cast<long long>(steps_run), report.seconds, report.samples_per_second,
                  report.samples_per_second * static_cast<double>(options.block_size()),
                  average(0, window), average(n - window, n), window);
  }
  out << line << "peak memory per stage (allocated by its tasks; on a GPU, by its device):";
  for (size_t s = 0; s < report.peak_bytes_per_stage.size(); ++s) {
    out << (s ? "," : "") << " stage " << s << " " << mib(report.peak_bytes_per_stage[s]);
    if (!summary.devices[s].is_cpu()) out << " (" << summary.devices[s] << ")";
  }
  std::snprintf(line, sizeof(line),
                "\nbubble: %.1f%% of worker time idle (schedule bound %.1f%%); %lld tasks traced\n",
                100 * report.bubble_fraction, 100 * report.bubble_bound,
                static_cast<long long>(report.traced_tasks));
  out << line;
  if (!c.trace.empty()) {
    out << "trace: " << c.trace;
    if (c.ranks) {
      std::snprintf(line, sizeof(line), " (a process per rank; clocks aligned to within %.0f us)",
                    summary.clock_uncertainty_us);
      out << line;
    }
    out << "\n";
  }
  if (!c.timeline.empty()) out << "timeline: " << c.timeline << "\n";
  if (!c.save.empty()) out << "model: " << c.save << "\n";
  if (!saves.empty()) {
    std::vector<double> milliseconds;
    for (const auto& save : saves) milliseconds.push_back(1e3 * save.seconds);
    std::sort(milliseconds.begin(), milliseconds.end());
    std::snprintf(line, sizeof(line),
                  "snapshots: %zu in %s, %.0f ms each (median), %s each by rank 0\n", saves.size(),
                  c.snapshot_dir.c_str(), milliseconds[milliseconds.size() / 2],
                  mib(saves.back().bytes).c_str());
    out << line;
  }
  return report;
}

}  // namespace cli
}  // namespace gpipe

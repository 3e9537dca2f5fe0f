#include "train.h"

#include "precision.h"

#include <gpipe/schedule/schedule_file.h>

#include <c10/util/StringUtil.h>
#include <torch/cuda.h>

#include <filesystem>
#include <memory>
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
  bool untie = false;
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
  app->add_flag("--untie", f.untie,
                "give the head a projection of its own, not the token embedding's weight")
      ->group(data);
  option(data, "--load", c.load, "start from a model saved with --save (its sizes win)")
      ->type_name("FILE");
  option(data, "--save", c.save, "save the trained model (for gpipe generate)")->type_name("FILE");
  const char* training = "training";
  option(training, "--steps", c.steps, "optimizer steps")->check(at_least(1));
  option(training, "--batch-size", c.batch_size, "samples per step")->check(at_least(1));
  option(training, "--lr", c.learning_rate, "AdamW learning rate")->check(greater_than(0));
  option(training, "--seed", c.seed, "for weights and batches")->check(at_least(0));
  const std::vector<std::string> precisions = {"fp32", "bf16", "fp16"};
  option(training, "--precision", c.precision,
         listed(precisions) +
             ": autocast's lower precision for the stages' matrix products; "
             "fp16 scales the loss")
      ->type_name("P")
      ->check(one_of(precisions));
  option(training, "--loss-scale", c.loss_scale,
         "with --precision fp16: the first loss scale (it then grows and backs off)")
      ->check(CLI::PositiveNumber);
  option(training, "--clip-grad-norm", c.clip_grad_norm,
         "clip the gradients by their norm over the whole model (0: no clipping)")
      ->check(CLI::NonNegativeNumber);
  option(training, "--eval-every", c.eval_every,
         "every N steps, the loss on held-out text (the corpus's last tenth)")
      ->default_str("never")
      ->check(at_least(1));
  const char* pipeline = "pipeline";
  option(pipeline, "--stages", c.stages,
         "pipeline stages (on ranks: WORLD_SIZE x --virtual-stages)")
      ->check(at_least(1));
  option(pipeline, "--chunks", c.chunks, "micro-batches per step")->check(at_least(1));
  option(pipeline, "--receive-window", c.receive_window,
         "on ranks: receives posted ahead per edge (default: the most micro-batches a stage "
         "holds at once)")
      ->default_str("automatic")
      ->check(at_least(1));
  option(pipeline, "--schedule", c.schedule, listed(schedule::schedule_names()))
      ->type_name("NAME")
      ->check(one_of(schedule::schedule_names()));
  option(pipeline, "--virtual-stages", c.virtual_stages,
         "stages per worker: any for " +
             schedule::schedule_name_list(schedule::schedule_kinds_where(schedule::loops_stages)) +
             ", 2 for " +
             schedule::schedule_name_list(schedule::schedule_kinds_where([](auto kind) {
               return schedule::placement_of(kind) == schedule::Placement::kV;
             })))
      ->check(at_least(1));
  app->add_flag("--simulate", c.simulate,
                "train nothing: profile the model and predict a step of every schedule it allows "
                "(gpipe/schedule/predict.h)")
      ->group(pipeline);
  const std::vector<std::string> plans = {"none", "show", "auto"};
  option(pipeline, "--plan", c.plan,
         "show: train nothing, rank every schedule, stages per worker, micro-batch count and "
         "checkpointing with its best balance for the workers of --stages / --virtual-stages, "
         "or the ranks, planned by rank 0 (gpipe/plan.h); auto: then train with the choice")
      ->type_name("MODE")
      ->check(one_of(plans));
  option(pipeline, "--memory-budget", c.memory_budget_mib,
         "with --simulate: the activations one worker may hold; with --plan: all it may hold, "
         "parameters, gradients and AdamW's moments too; in MiB (0: any)")
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
  for (const char* shape : {"--layers", "--embedding-dim", "--heads", "--block-size", "--untie"}) {
    if (!c.load.empty() && app->count(shape) > 0) {
      throw UsageError(std::string(shape) +
                       " cannot change a model read with --load (its sizes are saved with it)");
    }
  }
  c.model.num_layers(f.layers)
      .embedding_dim(f.embedding_dim)
      .num_heads(f.heads)
      .block_size(f.block_size)
      .tie_embeddings(!f.untie);
  if (c.model.embedding_dim() % c.model.num_heads() != 0) {
    throw UsageError("--heads " + std::to_string(c.model.num_heads()) +
                     " must divide --embedding-dim " + std::to_string(c.model.embedding_dim()));
  }
  c.checkpoint = parse_checkpoint_mode(f.checkpoint);
  if (app->count("--devices") > 0) c.devices = parse_devices(f.devices);
  if (app->count("--loss-scale") > 0 && c.precision != "fp16") {
    throw UsageError("--loss-scale needs --precision fp16");
  }
  try {
    Precision(c.precision, device_types(c.devices));  // can autocast run it here?
  } catch (const c10::ValueError& error) {
    throw UsageError("--precision " + c.precision + ": " + error.what_without_backtrace());
  }
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
  if (c.plan != "none") {
    for (const char* chosen : {"--schedule", "--schedule-file", "--chunks", "--checkpoint"}) {
      if (app->count(chosen) > 0) {
        throw UsageError(std::string("--plan chooses ") + chosen + " itself: leave it out");
      }
    }
    if (c.simulate) throw UsageError("--plan and --simulate each predict: give one of them");
  }

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
  } else if (app->count("--receive-window") > 0) {
    throw UsageError(
        "--receive-window applies to ranks, whose stages exchange messages; on "
        "threads they pass tensors");
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

}  // namespace cli
}  // namespace gpipe

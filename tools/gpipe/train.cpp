#include "train.h"

#include "model_file.h"
#include "precision.h"
#include "progress.h"
#include "train_pipeline.h"
#include "train_snapshot.h"

#include <gpipe/balance/balance.h>
#include <gpipe/memory.h>
#include <gpipe/schedule/predict.h>
#include <gpipe/schedule/runtime.h>
#include <gpipe/trace.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

namespace gpipe {
namespace cli {
namespace {

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

torch::nn::Sequential make_model(const TrainConfig& c, models::CharGPTOptions& options) {
  if (c.load.empty()) {
    options = c.model;
    return models::char_gpt(options);
  }
  SavedModel saved = load_model(c.load);
  options = saved.options;
  return saved.model;
}

std::string describe_model(const torch::nn::Sequential& model,
                           const models::CharGPTOptions& options, const std::string& file) {
  int64_t parameters = 0;
  std::set<const c10::TensorImpl*> counted;
  for (const auto& p : model->parameters()) {
    if (counted.insert(p.unsafeGetTensorImpl()).second) parameters += p.numel();
  }
  return c10::str("char GPT (", options.num_layers(), " blocks, width ", options.embedding_dim(),
                  ", ", parameters, " parameters, ",
                  options.tie_embeddings() ? "tied" : "untied", " embeddings)",
                  file.empty() ? "" : " from ", file);
}

TrainReport train(const TrainConfig& c, std::ostream& out, bool interactive,
                  const distributed::ProcessGroup* ranks) {
  memory::install_tracking_cpu_allocator();
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  models::CharGPTOptions options;
  torch::nn::Sequential model = make_model(c, options);
  const int64_t layers = static_cast<int64_t>(model->size());
  if (c.stages > layers) {
    throw UsageError("--stages " + std::to_string(c.stages) + " is more than the model's " +
                     std::to_string(layers) + " layers");
  }
  TextCorpus corpus = TextCorpus::load(c.data, options.block_size() + 1);
  // --eval-every holds out the text's last tenth (at least a window).
  std::optional<std::pair<at::Tensor, at::Tensor>> validation;
  if (c.eval_every > 0) {
    const int64_t window = options.block_size() + 1;
    const int64_t held_out = std::max(window, corpus.size() / 10);
    if (corpus.size() - held_out < window) {
      throw UsageError("--eval-every: the text has " + std::to_string(corpus.size()) +
                       " bytes, too few to hold out " + std::to_string(held_out) +
                       " and train on the rest (a window is " + std::to_string(window) + ")");
    }
    auto [training, held] = corpus.split(held_out);
    corpus = std::move(training);
    validation = held.spaced_batch(c.batch_size, options.block_size());
  }
  const auto balance = c.balance.empty() ? balance::balance_by_count(c.stages, layers) : c.balance;
  // Every rank builds the whole model from the seed and trains its own stages.
  const auto pipeline = TrainPipeline::make(c, model, balance, ranks);
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

  std::string balance_text;
  for (const auto b : balance)
    balance_text += (balance_text.empty() ? "" : ",") + std::to_string(b);
  shown << "gpipe train: " << describe_model(model, options, c.load) << " on " << corpus.size()
        << " bytes from " << corpus.num_files() << " files\n"
        << "  " << c.stages << " stages [" << balance_text << "] on " << pipeline->workers() << ", "
        << c.chunks << " micro-batches, schedule " << schedule_name(c) << ", checkpoint "
        << c.checkpoint << ", batch " << c.batch_size << " x " << options.block_size() << " bytes, "
        << c.steps << " steps\n"
        << "  precision " << c.precision << (c.precision == "fp16" ? " (loss scaled)" : "");
  if (c.clip_grad_norm > 0) shown << ", gradients clipped to norm " << c.clip_grad_norm;
  if (validation) {
    shown << ", validation every " << c.eval_every << " steps on " << validation->first.size(0)
          << " windows of held-out text";
  }
  shown << "\n";
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
  const std::vector<c10::DeviceType> autocast_on = device_types(c.devices);
  for (int64_t step = first; step <= c.steps; ++step) {
    auto [input, target] = corpus.batch(c.batch_size, options.block_size(), generator);
    optimizer.zero_grad();
    double loss = 0;
    {
      Precision precision(c.precision, autocast_on);
      loss = pipeline->step(input, target).item<double>();
    }
    if (c.clip_grad_norm > 0) pipeline->clip_grad_norm(c.clip_grad_norm);
    if (const auto& scaler = pipeline->grad_scaler()) {
      if (!scaler->step(optimizer)) ++report.skipped_steps;
      scaler->update();
    } else {
      optimizer.step();
    }
    report.losses.push_back(loss);
    progress.update(step, loss);
    if (validation && (step % c.eval_every == 0 || step == c.steps)) {
      double validation_loss = 0;
      {
        Precision precision(c.precision, autocast_on);
        validation_loss = pipeline->evaluate(validation->first, validation->second).item<double>();
      }
      report.validation_losses.emplace_back(step, validation_loss);
      char line[96];
      std::snprintf(line, sizeof(line), "step %lld: validation loss %.4f",
                    static_cast<long long>(step), validation_loss);
      progress.note(line);
    }
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
    write_file(c.trace, [&](std::ostream& o) {
      trace::write_chrome_trace(kept, o, pipeline->tracer().origin());
    });
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
  out << line;
  if (!report.validation_losses.empty()) {
    std::snprintf(line, sizeof(line), "validation loss %.3f -> %.3f (steps %lld and %lld)\n",
                  report.validation_losses.front().second, report.validation_losses.back().second,
                  static_cast<long long>(report.validation_losses.front().first),
                  static_cast<long long>(report.validation_losses.back().first));
    out << line;
  }
  if (pipeline->grad_scaler()) {
    out << "loss scale " << pipeline->grad_scaler()->scale() << "; " << report.skipped_steps
        << " step(s) skipped for inf or NaN gradients\n";
  }
  out << "peak memory per stage (allocated by its tasks; on a GPU, by its device):";
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

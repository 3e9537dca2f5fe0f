#include "train_snapshot.h"

#include "arguments.h"
#include "atomic_file.h"

#include <c10/util/Exception.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace gpipe {
namespace cli {
namespace {

namespace fs = std::filesystem;

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string rank_file(int64_t rank) { return "rank-" + std::to_string(rank) + ".pt"; }

// The archive's name of parameter or buffer `index` of layer `layer`.
std::string tensor_key(int64_t layer, size_t index) {
  return "layer" + std::to_string(layer) + "_tensor" + std::to_string(index);
}

// A layer's parameters, then its buffers, in the module's order.
std::vector<at::Tensor> state_of(const torch::nn::Sequential& model, int64_t layer) {
  std::vector<at::Tensor> tensors = model->ptr(layer)->parameters();
  for (const auto& buffer : model->ptr(layer)->buffers()) tensors.push_back(buffer);
  return tensors;
}

constexpr const char* kSeparator = " = ";

std::string manifest_text(const Manifest& manifest) {
  std::string text;
  for (const auto& [name, value] : manifest) text += name + kSeparator + value + "\n";
  return text;
}

Manifest read_manifest(const fs::path& path) {
  std::ifstream in(path);
  Manifest manifest;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(kSeparator);
    if (at != std::string::npos) {
      manifest.emplace_back(line.substr(0, at), line.substr(at + std::strlen(kSeparator)));
    }
  }
  return manifest;
}

// The last complete snapshot of `dir` ("" where there is none), checked against `manifest`.
std::string latest_snapshot(const std::string& dir, const Manifest& manifest) {
  std::ifstream latest(fs::path(dir) / "latest");
  std::string name;
  if (!latest || !std::getline(latest, name) || name.empty()) return "";
  const fs::path folder = fs::path(dir) / name;
  if (!fs::is_regular_file(folder / "manifest.txt")) {
    throw UsageError("--resume: " + (fs::path(dir) / "latest").string() + " names " +
                     folder.string() + ", which has no manifest.txt");
  }
  const Manifest saved = read_manifest(folder / "manifest.txt");
  std::string differences;
  for (const auto& [name_of, value] : manifest) {
    std::string was = "none";
    for (const auto& [saved_name, saved_value] : saved) {
      if (saved_name == name_of) was = saved_value;
    }
    if (was == value) continue;
    differences += (differences.empty() ? "" : "; ") + name_of + " " + was + ", this run " + value;
  }
  if (!differences.empty()) {
    throw UsageError("--resume: the snapshot " + folder.string() +
                     " does not fit this run: " + differences + "; nothing was loaded");
  }
  return name;
}

}  // namespace

Manifest make_manifest(const TrainConfig& c, const models::CharGPTOptions& options,
                       const std::vector<int64_t>& balance, const TrainPipeline& pipeline) {
  std::string balance_text;
  for (const auto b : balance) {
    balance_text += (balance_text.empty() ? "" : ",") + std::to_string(b);
  }
  return {{"engine", c.ranks ? "ranks" : "threads"},
          {"world size", std::to_string(pipeline.world_size())},
          {"balance", "[" + balance_text + "]"},
          {"schedule", schedule_name(c)},
          {"virtual stages", std::to_string(c.virtual_stages)},
          {"layers", std::to_string(options.num_layers())},
          {"embedding dim", std::to_string(options.embedding_dim())},
          {"heads", std::to_string(options.num_heads())},
          {"block size", std::to_string(options.block_size())},
          {"tied embeddings", options.tie_embeddings() ? "yes" : "no"},
          {"precision", c.precision}};
}

SaveCost save_snapshot(const std::string& dir, int64_t step, const Manifest& manifest,
                       TrainPipeline& pipeline, const torch::nn::Sequential& model,
                       const torch::optim::Optimizer& optimizer, at::Generator& batches) {
  const auto start = std::chrono::steady_clock::now();
  const std::string name = step_name(step);
  const fs::path folder = fs::path(dir) / name;
  std::error_code error;
  fs::create_directories(folder, error);
  if (error) {
    throw std::runtime_error("cannot make the snapshot folder '" + folder.string() +
                             "': " + error.message());
  }
  torch::serialize::OutputArchive archive;
  archive.write("step", torch::tensor(step, torch::kInt64));
  for (const int64_t layer : pipeline.layers()) {
    const auto tensors = state_of(model, layer);
    for (size_t k = 0; k < tensors.size(); ++k) {
      archive.write(tensor_key(layer, k), tensors[k].detach(), /*is_buffer=*/true);
    }
  }
  torch::serialize::OutputArchive optimizer_state;
  optimizer.save(optimizer_state);
  archive.write("optimizer", optimizer_state);
  if (const auto& scaler = pipeline.grad_scaler()) {
    torch::serialize::OutputArchive scaler_state;
    scaler->save(scaler_state);
    archive.write("grad_scaler", scaler_state);
  }
  {
    std::lock_guard<std::mutex> lock(batches.mutex());
    archive.write("batches", batches.get_state(), /*is_buffer=*/true);
  }
  const std::string file = (folder / rank_file(pipeline.rank())).string();
  try {
    write_atomically(file, [&](const std::string& temporary) { archive.save_to(temporary); });
    if (pipeline.rank() == 0) {
      write_text_atomically((folder / "manifest.txt").string(), manifest_text(manifest));
    }
  } catch (const c10::Error& e) {
    throw std::runtime_error("cannot write the snapshot '" + file +
                             "': " + e.what_without_backtrace());
  }
  // It counts once every rank's part is on disk.
  pipeline.barrier("saved-" + name);
  if (pipeline.rank() == 0) {
    write_text_atomically((fs::path(dir) / "latest").string(), name + "\n");
  }
  SaveCost cost;
  cost.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cost.bytes = static_cast<int64_t>(fs::file_size(file));
  return cost;
}

int64_t resume_snapshot(const std::string& dir, const Manifest& manifest, TrainPipeline& pipeline,
                        const torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                        at::Generator& batches) {
  // Rank 0 decides for all: the snapshot's name, "" for none, or "!" and the error.
  std::string found;
  if (pipeline.rank() == 0) {
    try {
      found = latest_snapshot(dir, manifest);
    } catch (const UsageError& error) {
      found = std::string("!") + error.what();
    }
  }
  found = pipeline.broadcast("resume", found);
  if (!found.empty() && found[0] == '!') throw UsageError(found.substr(1));
  if (found.empty()) return 0;

  const std::string file = (fs::path(dir) / found / rank_file(pipeline.rank())).string();
  if (!fs::is_regular_file(file)) {
    throw UsageError("--resume: rank " + std::to_string(pipeline.rank()) + " has no '" + file +
                     "'");
  }
  torch::serialize::InputArchive archive;
  torch::Tensor step;
  try {
    archive.load_from(file);
    archive.read("step", step);
    torch::NoGradGuard no_grad;
    for (const int64_t layer : pipeline.layers()) {
      auto tensors = state_of(model, layer);
      for (size_t k = 0; k < tensors.size(); ++k) {
        torch::Tensor saved;
        archive.read(tensor_key(layer, k), saved, /*is_buffer=*/true);
        tensors[k].copy_(saved);
      }
    }
    torch::serialize::InputArchive optimizer_state;
    archive.read("optimizer", optimizer_state);
    optimizer.load(optimizer_state);
    if (const auto& scaler = pipeline.grad_scaler()) {
      torch::serialize::InputArchive scaler_state;
      archive.read("grad_scaler", scaler_state);
      scaler->load(scaler_state);
    }
    torch::Tensor state;
    archive.read("batches", state, /*is_buffer=*/true);
    std::lock_guard<std::mutex> lock(batches.mutex());
    batches.set_state(state);
  } catch (const c10::Error& error) {
    throw UsageError("--resume: cannot read '" + file + "': " + error.what_without_backtrace());
  }
  return step.item<int64_t>();
}

}  // namespace cli
}  // namespace gpipe

#include "model_file.h"

#include "arguments.h"
#include "atomic_file.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>

namespace gpipe {
namespace cli {
namespace {

// The sizes, stored as int64 tensors beside the weights.
constexpr const char* kPrefix = "gpipe.char_gpt.";

}  // namespace

void save_model(const std::string& path, torch::nn::Sequential& model,
                const models::CharGPTOptions& options) {
  torch::serialize::OutputArchive archive;
  model->save(archive);
  const auto write = [&](const char* name, double value) {
    archive.write(std::string(kPrefix) + name, torch::tensor(value, torch::kDouble));
  };
  write("vocab_size", static_cast<double>(options.vocab_size()));
  write("block_size", static_cast<double>(options.block_size()));
  write("embedding_dim", static_cast<double>(options.embedding_dim()));
  write("num_heads", static_cast<double>(options.num_heads()));
  write("num_layers", static_cast<double>(options.num_layers()));
  write("dropout", options.dropout());
  write("tie_embeddings", options.tie_embeddings() ? 1 : 0);
  // A failed save (a full disk, a crash) leaves the previous model whole.
  try {
    write_atomically(path, [&](const std::string& temporary) { archive.save_to(temporary); });
  } catch (const std::exception& error) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    throw std::runtime_error("cannot save the model to '" + path + "' (" +
                             (c10_error ? c10_error->what_without_backtrace() : error.what()) +
                             "); any previous file there is unchanged");
  }
}

SavedModel load_model(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw UsageError("model file '" + path + "' does not exist");
  }
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path, torch::kCPU);
  } catch (const c10::Error&) {
    throw UsageError("'" + path + "' is not a model saved by gpipe train --save");
  }
  const auto read = [&](const char* name, c10::optional<double> otherwise = c10::nullopt) {
    torch::Tensor value;
    if (!archive.try_read(std::string(kPrefix) + name, value)) {
      if (otherwise) return *otherwise;
      throw UsageError("'" + path + "' is not a model saved by gpipe train --save (no " + name +
                       ")");
    }
    return value.item<double>();
  };
  SavedModel saved;
  saved.options.vocab_size(static_cast<int64_t>(read("vocab_size")))
      .block_size(static_cast<int64_t>(read("block_size")))
      .embedding_dim(static_cast<int64_t>(read("embedding_dim")))
      .num_heads(static_cast<int64_t>(read("num_heads")))
      .num_layers(static_cast<int64_t>(read("num_layers")))
      .dropout(read("dropout"))
      .tie_embeddings(read("tie_embeddings", /*models saved before ties=*/0.0) != 0);
  saved.model = models::char_gpt(saved.options);
  saved.model->load(archive);
  return saved;
}

}  // namespace cli
}  // namespace gpipe

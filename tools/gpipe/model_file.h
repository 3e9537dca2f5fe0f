// A saved char GPT: its sizes and its weights in one torch::save archive, so `gpipe generate`
// (or a later `gpipe train --load`) rebuilds the same model.
#pragma once

#include "models/char_gpt.h"

#include <torch/nn/modules/container/sequential.h>

#include <string>

namespace gpipe {
namespace cli {

struct SavedModel {
  models::CharGPTOptions options;
  torch::nn::Sequential model;
};

/// Writes `model` built with `options` to `path`, atomically: to `path`.partial, then renamed.
/// Throws std::runtime_error if it cannot be written; a file already at `path` is then unchanged.
void save_model(const std::string& path, torch::nn::Sequential& model,
                const models::CharGPTOptions& options);

/// Reads what save_model() wrote (on CPU). Throws UsageError if `path` does not exist or is not
/// such a file.
SavedModel load_model(const std::string& path);

}  // namespace cli
}  // namespace gpipe

#include "text_corpus.h"

#include "arguments.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace gpipe {
namespace cli {

namespace fs = std::filesystem;

TextCorpus TextCorpus::load(const std::vector<std::string>& paths, int64_t min_bytes) {
  std::vector<fs::path> files;
  for (const auto& path : paths) {
    std::error_code error;
    if (fs::is_directory(path, error)) {
      std::vector<fs::path> inside;
      for (const auto& entry : fs::directory_iterator(path, error)) {
        if (entry.is_regular_file()) inside.push_back(entry.path());
      }
      std::sort(inside.begin(), inside.end());
      files.insert(files.end(), inside.begin(), inside.end());
    } else if (fs::is_regular_file(path, error)) {
      files.emplace_back(path);
    } else {
      throw UsageError("data file '" + path + "' does not exist or is not a file");
    }
  }
  TextCorpus corpus;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw UsageError("cannot read data file '" + file.string() + "'");
    corpus.bytes_.insert(corpus.bytes_.end(), std::istreambuf_iterator<char>(in),
                         std::istreambuf_iterator<char>());
    ++corpus.num_files_;
  }
  if (corpus.size() < min_bytes) {
    throw UsageError("the training text has " + std::to_string(corpus.size()) +
                     " bytes, but needs at least " + std::to_string(min_bytes) +
                     " (one window of --block-size + 1)");
  }
  return corpus;
}

std::pair<at::Tensor, at::Tensor> TextCorpus::batch(int64_t batch_size, int64_t length,
                                                    at::Generator& generator) const {
  TORCH_INTERNAL_ASSERT(size() > length);
  return windows_at(
      torch::randint(size() - length, {batch_size}, generator, torch::TensorOptions(torch::kLong)),
      length);
}

std::pair<at::Tensor, at::Tensor> TextCorpus::spaced_batch(int64_t count, int64_t length) const {
  TORCH_INTERNAL_ASSERT(size() > length);
  return windows_at(
      torch::linspace(0, static_cast<double>(size() - length - 1), count, torch::kDouble)
          .to(torch::kLong),
      length);
}

std::pair<TextCorpus, TextCorpus> TextCorpus::split(int64_t held_out) const {
  TORCH_INTERNAL_ASSERT(held_out > 0 && held_out < size());
  TextCorpus first, last;
  first.bytes_.assign(bytes_.begin(), bytes_.end() - held_out);
  last.bytes_.assign(bytes_.end() - held_out, bytes_.end());
  first.num_files_ = last.num_files_ = num_files_;
  return {std::move(first), std::move(last)};
}

std::pair<at::Tensor, at::Tensor> TextCorpus::windows_at(const at::Tensor& starts,
                                                         int64_t length) const {
  const int64_t batch_size = starts.numel();
  auto windows = torch::empty({batch_size, length + 1}, torch::kLong);
  auto* out = windows.data_ptr<int64_t>();
  const auto* start = starts.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_size; ++b) {
    for (int64_t t = 0; t <= length; ++t) out[b * (length + 1) + t] = bytes_[start[b] + t];
  }
  return {windows.narrow(1, 0, length).contiguous(), windows.narrow(1, 1, length).contiguous()};
}

}  // namespace cli
}  // namespace gpipe

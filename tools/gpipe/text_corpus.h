// The training text of `gpipe train`: the bytes of some files, cut into random windows.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gpipe {
namespace cli {

/// Where the default text lives: license texts that every Debian machine has.
constexpr const char* kDefaultCorpusDirectory = "/usr/share/common-licenses";

/// Bytes of text to train on.
class TextCorpus {
 public:
  /// The bytes of `paths` in order; a directory stands for its regular files, sorted by name
  /// (not recursing). Throws UsageError for a path that does not exist or cannot be read, and
  /// if the text has fewer than `min_bytes` bytes.
  static TextCorpus load(const std::vector<std::string>& paths, int64_t min_bytes);

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  /// How many files the text came from.
  int64_t num_files() const { return num_files_; }

  /// `batch_size` windows of `length` + 1 bytes at random offsets: inputs [batch, length] and
  /// targets (the same shifted by one), both int64. REQUIRES: size() > length.
  std::pair<at::Tensor, at::Tensor> batch(int64_t batch_size, int64_t length,
                                          at::Generator& generator) const;

  /// `count` windows like batch()'s, evenly spaced from the first byte to the last: the same
  /// every time. REQUIRES: size() > length.
  std::pair<at::Tensor, at::Tensor> spaced_batch(int64_t count, int64_t length) const;

  /// The text cut in two: the first size() - held_out bytes, and the last held_out (text a model
  /// trained on the first part has not seen). REQUIRES: 0 < held_out < size().
  std::pair<TextCorpus, TextCorpus> split(int64_t held_out) const;

 private:
  // Windows of `length` + 1 bytes starting at `starts`.
  std::pair<at::Tensor, at::Tensor> windows_at(const at::Tensor& starts, int64_t length) const;

  std::vector<uint8_t> bytes_;
  int64_t num_files_ = 0;
};

}  // namespace cli
}  // namespace gpipe

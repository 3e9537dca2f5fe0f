// `gpipe generate`: samples text from a model saved by `gpipe train --save`.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace gpipe {
namespace cli {

struct GenerateConfig {
  std::string model;  // required: --model FILE
  std::string prompt;
  int64_t length = 300;
  double temperature = 0.8;
  int64_t seed = 0;
};

/// Reads the flags of `gpipe generate`. Throws UsageError for a bad flag or a missing --model.
GenerateConfig parse_generate_config(const std::vector<std::string>& args);

std::string generate_usage();

/// Writes the prompt and its continuation to `out`. Throws UsageError for an unreadable model.
void generate(const GenerateConfig& config, std::ostream& out);

}  // namespace cli
}  // namespace gpipe

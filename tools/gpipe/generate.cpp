#include "generate.h"

#include "arguments.h"
#include "model_file.h"

#include <ATen/CPUGeneratorImpl.h>

namespace gpipe {
namespace cli {

std::string generate_usage() {
  return R"(usage: gpipe generate --model FILE [flags]

Continues a prompt with a char GPT saved by `gpipe train --save FILE`.

  --model FILE        the saved model (required)
  --prompt TEXT       text to continue (default: a newline)
  --length N          bytes to generate (default 300)
  --temperature X     sampling temperature, > 0 (default 0.8)
  --seed N            sampling seed (default 0)
)";
}

GenerateConfig parse_generate_config(const std::vector<std::string>& args) {
  Arguments a(args);
  GenerateConfig c;
  const auto model = a.text("model");
  c.prompt = a.text("prompt", c.prompt);
  c.length = a.integer("length", c.length, 0);
  c.temperature = a.real("temperature", c.temperature, 0);
  c.seed = a.integer("seed", c.seed, 0);
  a.finish();
  if (!model) throw UsageError("needs --model FILE (from gpipe train --save)");
  c.model = *model;
  return c;
}

void generate(const GenerateConfig& c, std::ostream& out) {
  SavedModel saved = load_model(c.model);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.seed));
  out << c.prompt
      << models::sample(saved.model, saved.options, c.prompt, c.length, c.temperature, generator)
      << "\n";
}

}  // namespace cli
}  // namespace gpipe

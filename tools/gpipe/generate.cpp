#include "generate.h"

#include "arguments.h"
#include "model_file.h"

#include <ATen/CPUGeneratorImpl.h>

namespace gpipe {
namespace cli {

namespace {

std::unique_ptr<CLI::App> generate_command_line(GenerateConfig& c) {
  auto app = command_line("gpipe generate --model FILE [flags]",
                          "Continues a prompt with a char GPT saved by `gpipe train --save FILE`.");
  app->add_option("--model", c.model, "the saved model (required)")->type_name("FILE");
  app->add_option("--prompt", c.prompt, "text to continue (default: a newline)")->type_name("TEXT");
  app->add_option("--length", c.length, "bytes to generate")->type_name("N")->check(at_least(0));
  app->add_option("--temperature", c.temperature, "sampling temperature")
      ->type_name("X")
      ->check(greater_than(0));
  app->add_option("--seed", c.seed, "sampling seed")->type_name("N")->check(at_least(0));
  return app;
}

}  // namespace

std::string generate_usage() {
  GenerateConfig config;
  return generate_command_line(config)->help();
}

GenerateConfig parse_generate_config(const std::vector<std::string>& args) {
  GenerateConfig c;
  parse(*generate_command_line(c), args);
  if (c.model.empty()) throw UsageError("needs --model FILE (from gpipe train --save)");
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

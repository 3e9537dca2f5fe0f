// Command-line arguments of the `gpipe` command and of gpipe_launch, on CLI11: each command
// describes its flags in a CLI::App (which also writes its --help), and parse() reads them. Flags
// are `--name value` or `--name=value`, each at most once; whatever is malformed, unknown or out of
// range is a UsageError of one line naming the flag (exit code 2).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpipe {
namespace cli {

/// A bad command line: the message is one line that names the flag and the bad value.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A CLI::App for a subcommand's flags, as every subcommand has them: `description` and the
/// usage line `name` (e.g. "gpipe train [flags]") head its help, each flag's default is shown
/// there, a flag given twice is an error. Name each option's value (`type_name`): N, X, FILE, ...
///
/// Example:
///   int64_t steps = 300;
///   auto app = command_line("gpipe train [flags]", "Trains a char GPT.");
///   app->add_option("--steps", steps, "optimizer steps")->check(at_least(1));
///   parse(*app, {"--steps", "20"});  // steps == 20
std::unique_ptr<CLI::App> command_line(const std::string& name, const std::string& description);

/// Reads `args` into `app`'s options. Throws UsageError for a positional argument, an unknown
/// flag, a flag given twice or without its value, or a value its validators refuse.
void parse(CLI::App& app, const std::vector<std::string>& args);

/// True if --help or -h is among `args`: help wins over whatever else is there, even errors.
bool asks_for_help(const std::vector<std::string>& args);

/// An integer >= `min` (e.g. "must be at least 1, but got -3").
CLI::Validator at_least(int64_t min);

/// An integer in [min, max] (e.g. "must be an integer in [1, 4096], but got 0").
CLI::Validator in_range(int64_t min, int64_t max);

/// A number > `above`.
CLI::Validator greater_than(double above);

/// One of `choices` (e.g. "must be one of gpipe, 1f1b, but got '2f2b'").
CLI::Validator one_of(const std::vector<std::string>& choices);

/// `choices` as a help text lists them: "gpipe | 1f1b".
std::string listed(const std::vector<std::string>& choices);

/// Checks, before any work, that a file can be written at `path` (given with `flag`): its folder
/// exists and is writable, and `path` is not a folder. Throws UsageError naming both otherwise.
void check_output_path(const std::string& flag, const std::string& path);

}  // namespace cli
}  // namespace gpipe

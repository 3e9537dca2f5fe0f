// Command-line arguments of the `gpipe` command: `--name value` or `--name=value` flags, read
// by type; whatever is malformed, unknown or out of range is a UsageError (exit code 2).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
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

/// The flags of one subcommand. Each getter consumes its flag; finish() then refuses any flag
/// nobody asked for.
///
/// Example:
///   Arguments args({"--steps", "20", "--quiet"});
///   int64_t steps = args.integer("steps", 300, /*min=*/1);  // 20
///   bool quiet = args.flag("quiet");                         // true
///   args.finish();
class Arguments {
 public:
  /// Throws UsageError for a positional argument or a flag given twice.
  explicit Arguments(const std::vector<std::string>& args);

  /// The value of --name, or nullopt. Throws UsageError if --name has no value.
  std::optional<std::string> text(const std::string& name);
  std::string text(const std::string& name, const std::string& fallback);

  /// The value of --name as an integer >= `min`, or `fallback`.
  int64_t integer(const std::string& name, int64_t fallback, int64_t min);

  /// The value of --name as a number > `above`, or `fallback`.
  double real(const std::string& name, double fallback, double above);

  /// Whether the value-less flag --name was given. Throws UsageError if it has a value.
  bool flag(const std::string& name);

  /// One of `choices` for --name, or `fallback`.
  std::string choice(const std::string& name, const std::string& fallback,
                     const std::vector<std::string>& choices);

  /// True if --name was given (without consuming it).
  bool has(const std::string& name) const { return values_.count(name) > 0; }

  /// Throws UsageError naming the first flag that no getter consumed.
  void finish() const;

 private:
  std::map<std::string, std::optional<std::string>> values_;
  std::vector<std::string> order_;  // flags as given, for finish()'s message
  std::set<std::string> consumed_;
};

/// Checks, before any work, that a file can be written at `path` (given with `flag`): its folder
/// exists and is writable, and `path` is not a folder. Throws UsageError naming both otherwise.
void check_output_path(const std::string& flag, const std::string& path);

}  // namespace cli
}  // namespace gpipe

#include "arguments.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <limits>

namespace gpipe {
namespace cli {

namespace {

// The help's usage line is the app's name (which says how to call it); flag lines read
// `--steps N   optimizer steps (default 300)`.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(26); }
  std::string make_option_opts(const CLI::Option* option) const override {
    return option->get_type_size() == 0 ? "" : " " + option->get_type_name();
  }
  std::string make_description(const CLI::App* app) const override {
    return "usage: " + app->get_name() + "\n\n" + app->get_description() + "\n\n";
  }
  // One blank line between groups (CLI11 puts one before each group as well as after).
  std::string make_group(std::string group, bool is_positional,
                         std::vector<const CLI::Option*> options) const override {
    return CLI::Formatter::make_group(group, is_positional, options).substr(1);
  }
  std::string make_usage(const CLI::App*, std::string) const override { return ""; }
  std::string make_option_desc(const CLI::Option* option) const override {
    const std::string fallback = option->get_default_str();
    if (option->get_type_size() == 0 || fallback.empty()) return option->get_description();
    return option->get_description() + " (default " + fallback + ")";
  }
};

// `choices` joined by `separator`.
std::string join(const std::vector<std::string>& choices, const std::string& separator) {
  std::string text;
  for (const auto& c : choices) text += (text.empty() ? "" : separator) + c;
  return text;
}

// An integer validator; `range` words the bounds for its message.
CLI::Validator integer(int64_t min, int64_t max, const std::string& range) {
  return CLI::Validator(
      [min, max, range](std::string& value) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long parsed = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno != 0) {
          return "must be an integer, but got '" + value + "'";
        }
        if (parsed < min || parsed > max) return "must be " + range + ", but got " + value;
        return "";
      },
      "");
}

}  // namespace

std::unique_ptr<CLI::App> command_line(const std::string& name, const std::string& description) {
  auto app = std::make_unique<CLI::App>(description, name);
  app->formatter(std::make_shared<HelpFormatter>());
  app->set_help_flag("-h,--help", "print this help and exit");
  app->option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::Throw);
  // Unknown flags and positionals are named by parse(), in gpipe's words.
  app->allow_extras();
  return app;
}

void parse(CLI::App& app, const std::vector<std::string>& args) {
  // CLI11 reads its arguments from the back.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ArgumentMismatch& error) {
    const std::string what = error.what();
    const auto colon = what.find(':');
    const std::string flag = what.substr(0, colon);
    throw UsageError(what.find("At Most 1") != std::string::npos ? flag + " is given twice"
                                                                 : flag + " needs a value");
  } catch (const CLI::ParseError& error) {
    throw UsageError(error.what());
  }
  const std::vector<std::string> extras = app.remaining();
  if (!extras.empty()) {
    const std::string& first = extras.front();
    if (first.rfind("-", 0) == 0) throw UsageError("unknown flag " + first + " (see --help)");
    throw UsageError("unexpected argument '" + first + "' (flags look like --name value)");
  }
}

bool asks_for_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& arg) { return arg == "--help" || arg == "-h"; });
}

CLI::Validator at_least(int64_t min) {
  return integer(min, std::numeric_limits<int64_t>::max(), "at least " + std::to_string(min));
}

CLI::Validator in_range(int64_t min, int64_t max) {
  return integer(min, max,
                 "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

CLI::Validator greater_than(double above) {
  return CLI::Validator(
      [above](std::string& value) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double parsed = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || errno != 0) {
          return "must be a number, but got '" + value + "'";
        }
        if (!(parsed > above)) {
          return "must be greater than " + CLI::detail::to_string(above) + ", but got " + value;
        }
        return "";
      },
      "");
}

CLI::Validator one_of(const std::vector<std::string>& choices) {
  return CLI::Validator(
      [choices](std::string& value) -> std::string {
        if (std::find(choices.begin(), choices.end(), value) != choices.end()) return "";
        return "must be one of " + join(choices, ", ") + ", but got '" + value + "'";
      },
      "");
}

std::string listed(const std::vector<std::string>& choices) { return join(choices, " | "); }

void check_output_path(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_directory(path, error)) {
    throw UsageError(flag + " '" + path + "' is a folder; it needs a file name");
  }
  const fs::path parent = fs::path(path).parent_path();
  const std::string folder = parent.empty() ? "." : parent.string();
  if (!fs::is_directory(folder, error)) {
    throw UsageError(flag + " '" + path + "': folder '" + folder + "' does not exist");
  }
  if (access(folder.c_str(), W_OK) != 0) {
    throw UsageError(flag + " '" + path + "': folder '" + folder + "' is not writable");
  }
}

}  // namespace cli
}  // namespace gpipe

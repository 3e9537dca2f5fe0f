#include "arguments.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

namespace gpipe {
namespace cli {

Arguments::Arguments(const std::vector<std::string>& args) {
  for (size_t k = 0; k < args.size(); ++k) {
    const std::string& arg = args[k];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      throw UsageError("unexpected argument '" + arg + "' (flags look like --name value)");
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const auto equals = name.find('='); equals != std::string::npos) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    } else if (k + 1 < args.size() && args[k + 1].compare(0, 2, "--") != 0) {
      value = args[++k];
    }
    if (values_.count(name)) throw UsageError("--" + name + " is given twice");
    values_.emplace(name, value);
    order_.push_back(name);
  }
}

std::optional<std::string> Arguments::text(const std::string& name) {
  consumed_.insert(name);
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  if (!it->second) throw UsageError("--" + name + " needs a value");
  return it->second;
}

std::string Arguments::text(const std::string& name, const std::string& fallback) {
  return text(name).value_or(fallback);
}

int64_t Arguments::integer(const std::string& name, int64_t fallback, int64_t min) {
  const auto value = text(name);
  if (!value) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(value->c_str(), &end, 10);
  if (value->empty() || *end != '\0' || errno != 0) {
    throw UsageError("--" + name + " must be an integer, but got '" + *value + "'");
  }
  if (parsed < min) {
    throw UsageError("--" + name + " must be at least " + std::to_string(min) + ", but got " +
                     *value);
  }
  return parsed;
}

double Arguments::real(const std::string& name, double fallback, double above) {
  const auto value = text(name);
  if (!value) return fallback;
  errno = 0;
  char* end = nullptr;
  const double parsed = std::strtod(value->c_str(), &end);
  if (value->empty() || *end != '\0' || errno != 0) {
    throw UsageError("--" + name + " must be a number, but got '" + *value + "'");
  }
  if (!(parsed > above)) {
    throw UsageError("--" + name + " must be greater than " + std::to_string(above) + ", but got " +
                     *value);
  }
  return parsed;
}

bool Arguments::flag(const std::string& name) {
  consumed_.insert(name);
  auto it = values_.find(name);
  if (it == values_.end()) return false;
  if (it->second) throw UsageError("--" + name + " takes no value, but got '" + *it->second + "'");
  return true;
}

std::string Arguments::choice(const std::string& name, const std::string& fallback,
                              const std::vector<std::string>& choices) {
  const auto value = text(name);
  if (!value) return fallback;
  std::string listed;
  for (const auto& c : choices) {
    if (c == *value) return c;
    listed += (listed.empty() ? "" : ", ") + c;
  }
  throw UsageError("--" + name + " must be one of " + listed + ", but got '" + *value + "'");
}

void Arguments::finish() const {
  for (const auto& name : order_) {
    if (!consumed_.count(name)) throw UsageError("unknown flag --" + name + " (see --help)");
  }
}

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

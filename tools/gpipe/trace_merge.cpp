#include "trace_merge.h"

#include "arguments.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

namespace gpipe {
namespace cli {

namespace {

std::unique_ptr<CLI::App> trace_merge_command_line(TraceMergeConfig& c) {
  auto app = command_line(
      "gpipe trace merge -o FILE [flags] TRACE...",
      "Joins the Chrome traces that the ranks of a pipeline wrote, each its own, into one: a "
      "process per rank,\non rank 0's clock (the ranks' tracers aligned theirs with it).");
  app->add_option("traces", c.inputs, "the ranks' trace files (JSON)")->type_name("TRACE...");
  app->add_option("-o,--output", c.output, "the merged Chrome trace (required)")->type_name("FILE");
  app->add_option("--timeline", c.timeline, "SVG picture of the last --timeline-steps steps")
      ->type_name("FILE");
  app->add_option("--timeline-steps", c.timeline_steps, "steps the timeline draws")
      ->type_name("N")
      ->check(at_least(1));
  return app;
}

int64_t integer_or_zero(const nlohmann::json& object, const char* key) {
  return object.is_object() && object.contains(key) && object.at(key).is_number_integer()
             ? object.at(key).get<int64_t>()
             : 0;
}

}  // namespace

std::string trace_merge_usage() {
  TraceMergeConfig config;
  return trace_merge_command_line(config)->help();
}

TraceMergeConfig parse_trace_merge_config(const std::vector<std::string>& args) {
  TraceMergeConfig c;
  parse(*trace_merge_command_line(c), args);
  if (c.inputs.empty()) throw UsageError("needs the trace files to merge (TRACE...)");
  if (c.output.empty()) throw UsageError("needs -o FILE, the merged trace");
  check_output_path("-o", c.output);
  if (!c.timeline.empty()) check_output_path("--timeline", c.timeline);
  return c;
}

std::vector<trace::Event> read_chrome_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("cannot read trace '" + path + "': " + std::strerror(errno));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw UsageError("trace '" + path + "' is not JSON: " + error.what());
  }
  // The JSON object format holds its events in traceEvents; the array format is the events.
  const nlohmann::json* events = &json;
  if (json.is_object()) {
    if (!json.contains("traceEvents")) {
      throw UsageError("trace '" + path + "' has no traceEvents: not a Chrome trace");
    }
    events = &json.at("traceEvents");
  }
  if (!events->is_array()) {
    throw UsageError("trace '" + path + "': traceEvents is not a list: not a Chrome trace");
  }
  std::vector<trace::Event> result;
  for (size_t k = 0; k < events->size(); ++k) {
    const nlohmann::json& e = (*events)[k];
    if (!e.is_object() || e.value("ph", "") != "X") continue;  // metadata is written anew
    for (const char* key : {"name", "ts", "dur"}) {
      if (!e.contains(key)) {
        throw UsageError("trace '" + path + "', event " + std::to_string(k) + ": no \"" + key +
                         "\"");
      }
    }
    if (!e.at("name").is_string() || !e.at("ts").is_number() || !e.at("dur").is_number()) {
      throw UsageError("trace '" + path + "', event " + std::to_string(k) +
                       ": name, ts or dur of the wrong type");
    }
    trace::Event event;
    event.name = e.at("name").get<std::string>();
    event.rank = integer_or_zero(e, "pid");
    event.worker = integer_or_zero(e, "tid");
    const nlohmann::json args = e.value("args", nlohmann::json::object());
    event.stage = integer_or_zero(args, "stage");
    event.microbatch = integer_or_zero(args, "microbatch");
    event.step = integer_or_zero(args, "step");
    event.begin_us = e.at("ts").get<double>();
    event.end_us = event.begin_us + e.at("dur").get<double>();
    result.push_back(std::move(event));
  }
  return result;
}

void trace_merge(const TraceMergeConfig& c, std::ostream& out) {
  std::vector<trace::Event> merged;
  std::map<int64_t, std::string> file_of_rank;
  for (const std::string& path : c.inputs) {
    const std::vector<trace::Event> events = read_chrome_trace(path);
    std::set<int64_t> ranks;
    for (const auto& e : events) ranks.insert(e.rank);
    for (const int64_t rank : ranks) {
      const auto [it, added] = file_of_rank.emplace(rank, path);
      if (!added) {
        throw UsageError("traces '" + it->second + "' and '" + path + "' both hold rank " +
                         std::to_string(rank) +
                         "'s tasks: merge the traces of different ranks (a trace of one process "
                         "holds rank 0's)");
      }
    }
    merged.insert(merged.end(), events.begin(), events.end());
  }
  std::stable_sort(merged.begin(), merged.end(), [](const trace::Event& a, const trace::Event& b) {
    return a.begin_us < b.begin_us;
  });
  const auto write = [](const std::string& path, const auto& writer) {
    std::ofstream file(path);
    writer(file);
    if (!file.flush()) throw UsageError("cannot write '" + path + "'");
  };
  write(c.output, [&](std::ostream& o) { trace::write_chrome_trace(merged, o); });
  out << c.output << ": " << merged.size() << " tasks of " << file_of_rank.size() << " rank"
      << (file_of_rank.size() == 1 ? "" : "s") << " from " << c.inputs.size() << " file"
      << (c.inputs.size() == 1 ? "" : "s") << "\n";
  if (!c.timeline.empty()) {
    int64_t last_step = 0;
    for (const auto& e : merged) last_step = std::max(last_step, e.step);
    std::vector<trace::Event> drawn;
    for (const auto& e : merged) {
      if (e.step > last_step - c.timeline_steps) drawn.push_back(e);
    }
    write(c.timeline, [&](std::ostream& o) { trace::write_svg_timeline(drawn, o); });
    const int64_t steps = std::min(c.timeline_steps, last_step + 1);
    out << c.timeline << ": the last " << steps << " step" << (steps == 1 ? "" : "s") << "\n";
  }
}

}  // namespace cli
}  // namespace gpipe

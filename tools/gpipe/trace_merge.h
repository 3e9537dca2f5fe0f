// `gpipe trace merge`: joins the trace files that the ranks of a multi-process pipeline wrote,
// each its own (trace::write_chrome_trace of its tracer's events), into one Chrome trace with a
// process per rank, and optionally an SVG timeline with a row per rank. The ranks' tracers
// joined one timeline (trace.h), so their times already share rank 0's clock.
#pragma once

#include <gpipe/trace.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace gpipe {
namespace cli {

struct TraceMergeConfig {
  std::vector<std::string> inputs;  // required: the ranks' trace files
  std::string output;               // required: -o FILE
  std::string timeline;             // SVG timeline of the last timeline_steps steps
  int64_t timeline_steps = 2;
};

/// Reads the flags of `gpipe trace merge`. Throws UsageError for a bad flag, no input, no -o or
/// an output that cannot be written.
TraceMergeConfig parse_trace_merge_config(const std::vector<std::string>& args);

std::string trace_merge_usage();

/// The tasks ("X" events) of the Chrome trace at `path`: pid is the rank, tid the worker, args
/// the stage, micro-batch and step (0 where absent). Throws UsageError naming the file for one
/// that cannot be read, is not JSON, or is not a Chrome trace.
std::vector<trace::Event> read_chrome_trace(const std::string& path);

/// Merges the inputs and writes the outputs, then one line on `out` saying what it wrote. Throws
/// UsageError as read_chrome_trace does, and for two inputs that hold events of the same rank.
void trace_merge(const TraceMergeConfig& config, std::ostream& out);

}  // namespace cli
}  // namespace gpipe

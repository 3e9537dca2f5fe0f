// The Chrome trace writer: a timeline as JSON for chrome://tracing and ui.perfetto.dev.
#pragma once

#include "gpipe/trace/event.h"

#include <chrono>
#include <optional>
#include <ostream>
#include <vector>

namespace gpipe {
namespace trace {

/// Writes `events` in the Chrome trace event format (chrome://tracing, ui.perfetto.dev): one
/// complete ("X") event per task in process `rank`, thread `worker`, with stage, micro-batch and
/// step as args; a thread-name metadata ("M") event per worker and, where the events come from
/// several ranks (or another rank than 0), a process-name one per rank. Given the events'
/// `origin` (Tracer::origin()), the file says where their time 0 lies on this machine's steady
/// clock (CLOCK_MONOTONIC on Linux), in microseconds: "otherData": {"steady_clock_origin_us":
/// ...}, so that other records of the same clock can be laid beside them.
void write_chrome_trace(const std::vector<Event>& events, std::ostream& out,
                        std::optional<std::chrono::steady_clock::time_point> origin = std::nullopt);

}  // namespace trace
}  // namespace gpipe

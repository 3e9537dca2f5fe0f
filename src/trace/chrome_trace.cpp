#include "gpipe/trace/chrome_trace.h"

#include "trace/fixed.h"

#include <set>
#include <string>
#include <utility>

namespace gpipe {
namespace trace {
namespace {

// Event names are identifiers, but a caller may record anything: escape what JSON needs.
std::string json_escaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

}  // namespace

void write_chrome_trace(const std::vector<Event>& events, std::ostream& out,
                        std::optional<std::chrono::steady_clock::time_point> origin) {
  std::set<std::pair<int64_t, int64_t>> workers;  // (rank, worker)
  for (const auto& e : events) workers.insert({e.rank, e.worker});
  const bool ranked = from_ranks(events);
  out << "{\"displayTimeUnit\":\"ms\",";
  if (origin) {
    const double origin_us =
        std::chrono::duration<double, std::micro>(origin->time_since_epoch()).count();
    out << "\"otherData\":{\"steady_clock_origin_us\":" << fixed(origin_us, 3) << "},";
  }
  out << "\"traceEvents\":[";
  bool first = true;
  const auto separator = [&] {
    if (!first) out << ",";
    first = false;
    out << "\n";
  };
  int64_t named_rank = -1;
  for (const auto& [rank, worker] : workers) {
    if (ranked && rank != named_rank) {
      separator();
      out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank
          << ",\"args\":{\"name\":\"rank " << rank << "\"}}";
      separator();
      out << "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" << rank
          << ",\"args\":{\"sort_index\":" << rank << "}}";
      named_rank = rank;
    }
    separator();
    out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank << ",\"tid\":" << worker
        << ",\"args\":{\"name\":\"worker " << worker << "\"}}";
  }
  for (const auto& e : events) {
    separator();
    out << "{\"name\":\"" << json_escaped(e.name) << "\",\"cat\":\""
        << (is_compute(e)           ? "compute"
            : e.name == "recompute" ? "recompute"
                                    : "transfer")
        << "\",\"ph\":\"X\",\"pid\":" << e.rank << ",\"tid\":" << e.worker
        << ",\"ts\":" << fixed(e.begin_us, 3) << ",\"dur\":" << fixed(e.end_us - e.begin_us, 3)
        << ",\"args\":{\"stage\":" << e.stage << ",\"microbatch\":" << e.microbatch
        << ",\"step\":" << e.step << "}}";
  }
  out << "\n]}\n";
}

}  // namespace trace
}  // namespace gpipe

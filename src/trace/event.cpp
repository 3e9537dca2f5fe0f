#include "gpipe/trace/event.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace gpipe {
namespace trace {

bool is_compute(const Event& event) {
  return event.name == "forward" || event.name.rfind("backward", 0) == 0;
}

Utilization& Utilization::operator+=(const Utilization& other) {
  busy_us += other.busy_us;
  available_us += other.available_us;
  return *this;
}

double Utilization::bubble_fraction() const {
  return available_us > 0 ? 1.0 - busy_us / available_us : 0.0;
}

Utilization utilization(const std::vector<Event>& events) {
  // Per step: its span and the compute time of its workers.
  std::map<int64_t, std::pair<double, double>> spans;
  std::map<int64_t, double> busy;
  std::set<std::pair<int64_t, int64_t>> workers;  // (rank, worker)
  for (const auto& e : events) {
    auto it = spans.find(e.step);
    if (it == spans.end()) {
      spans.emplace(e.step, std::make_pair(e.begin_us, e.end_us));
    } else {
      it->second.first = std::min(it->second.first, e.begin_us);
      it->second.second = std::max(it->second.second, e.end_us);
    }
    if (is_compute(e)) busy[e.step] += e.end_us - e.begin_us;
    workers.insert({e.rank, e.worker});
  }
  Utilization result;
  for (const auto& [step, span] : spans) {
    result.available_us += static_cast<double>(workers.size()) * (span.second - span.first);
    result.busy_us += busy[step];
  }
  return result;
}

double bubble_fraction(const std::vector<Event>& events) {
  return utilization(events).bubble_fraction();
}

bool from_ranks(const std::vector<Event>& events) {
  return std::any_of(events.begin(), events.end(), [](const Event& e) { return e.rank != 0; });
}

}  // namespace trace
}  // namespace gpipe

#include "gpipe/schedule/render.h"

#include "gpipe/schedule/validate.h"

#include <c10/util/irange.h>

#include <algorithm>
#include <sstream>
#include <vector>

namespace gpipe {
namespace schedule {

std::string render(const Schedule& schedule) {
  const Timeline timeline = simulate(schedule);
  const bool interleaved = schedule.num_stages > schedule.num_workers;
  const int64_t W = schedule.num_workers;
  std::vector<std::vector<std::string>> cells(W,
                                              std::vector<std::string>(timeline.num_rounds, "."));
  size_t width = 1;
  for (const auto w : c10::irange(W)) {
    for (const auto k : c10::irange(schedule.actions[w].size())) {
      const Action& a = schedule.actions[w][k];
      if (!is_compute(a.kind)) continue;
      std::ostringstream cell;
      const char letter = a.kind == ActionKind::kForward          ? 'F'
                          : a.kind == ActionKind::kBackwardWeight ? 'W'
                                                                  : 'B';
      cell << letter << a.microbatch;
      if (interleaved) cell << ':' << a.stage;
      cells[w][timeline.rounds[w][k]] = cell.str();
      width = std::max(width, cell.str().size());
    }
  }
  std::ostringstream out;
  for (const auto w : c10::irange(W)) {
    // No idle rounds at the end of a row.
    while (!cells[w].empty() && cells[w].back() == ".") cells[w].pop_back();
    out << "worker " << w << " |";
    for (const auto& cell : cells[w]) out << ' ' << cell << std::string(width - cell.size(), ' ');
    out << '\n';
  }
  // No trailing blanks on a row.
  std::string text = out.str();
  std::string trimmed;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    line.erase(line.find_last_not_of(' ') + 1);
    trimmed += line + '\n';
  }
  return trimmed;
}

}  // namespace schedule
}  // namespace gpipe

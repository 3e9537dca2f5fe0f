#include "pipeline/clock_cycles.h"

#include <algorithm>

namespace gpipe {

std::ostream& operator<<(std::ostream& out, const Cell& cell) {
  return out << "(" << cell.microbatch << "," << cell.partition << ")";
}

std::vector<std::vector<Cell>> clock_cycles(size_t m, size_t n) {
  std::vector<std::vector<Cell>> clocks;
  if (m == 0 || n == 0) return clocks;
  for (size_t k = 0; k < m + n - 1; ++k) {
    std::vector<Cell> clock;
    for (size_t j = k + 1 > m ? k + 1 - m : 0; j < std::min(k + 1, n); ++j)
      clock.push_back({k - j, j});
    clocks.push_back(std::move(clock));
  }
  return clocks;
}

}  // namespace gpipe

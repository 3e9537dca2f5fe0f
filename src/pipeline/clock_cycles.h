// GPipe's schedule as clock cycles: at clock k, micro-batch i runs on partition j for every
// i + j == k.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <ostream>
#include <vector>

namespace gpipe {

/// One cell of the schedule: micro-batch `microbatch` on partition `partition`.
struct Cell {
  size_t microbatch;
  size_t partition;
  bool operator==(const Cell& other) const {
    return microbatch == other.microbatch && partition == other.partition;
  }
};
std::ostream& operator<<(std::ostream& out, const Cell& cell);

/// GPipe's schedule for m micro-batches over n partitions: clock k runs the cells (k - j, j) for
/// every partition j with 0 <= k - j < m, in order of j. There are m + n - 1 clocks.
///
///   clock_cycles(3, 3) = [(0,0)], [(1,0),(0,1)], [(2,0),(1,1),(0,2)], [(2,1),(1,2)], [(2,2)]
std::vector<std::vector<Cell>> clock_cycles(size_t m, size_t n);

}  // namespace gpipe

#include "gpipe/balance/block_partition.h"

#include "balance/check_partitions.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace gpipe {
namespace balance {
namespace {

// The fewest contiguous blocks of cost <= limit that cover `costs`. REQUIRES: limit >= max cost.
int64_t fewest_blocks(const std::vector<int64_t>& costs, int64_t limit) {
  int64_t blocks = 1;
  int64_t block = 0;
  for (const int64_t cost : costs) {
    if (block > limit - cost) {
      ++blocks;
      block = 0;
    }
    block += cost;
  }
  return blocks;
}

}  // namespace

std::vector<int64_t> block_partition(const std::vector<int64_t>& costs, int64_t partitions) {
  const auto n = static_cast<int64_t>(costs.size());
  detail::check_partitions(n, partitions);

  int64_t total = 0;
  int64_t largest = 0;
  for (size_t k = 0; k < costs.size(); ++k) {
    TORCH_CHECK_VALUE(costs[k] >= 0, "costs must be non-negative (costs[", k, "] = ", costs[k],
                      ")");
    TORCH_CHECK_VALUE(costs[k] <= std::numeric_limits<int64_t>::max() - total,
                      "the sum of costs overflows int64 (at costs[", k, "] = ", costs[k], ")");
    total += costs[k];
    largest = std::max(largest, costs[k]);
  }

  // With non-negative costs, a limit that `fewest_blocks` meets with at most `partitions` blocks
  // is met with exactly `partitions` (n >= partitions: splitting a block never raises the max).
  int64_t low = largest;  // feasible iff fewest_blocks(limit) <= partitions; total is feasible
  int64_t high = total;
  while (low < high) {
    const int64_t middle = low + (high - low) / 2;
    if (fewest_blocks(costs, middle) <= partitions) {
      high = middle;
    } else {
      low = middle + 1;
    }
  }
  const int64_t limit = low;

  // Reconstruct greedily from the left: each block takes as many items as fit under the limit,
  // leaving at least one item per remaining block. The rest stays feasible, because the fewest
  // blocks of a suffix never grow as the suffix shrinks.
  std::vector<int64_t> sizes;
  sizes.reserve(static_cast<size_t>(partitions));
  int64_t begin = 0;
  for (int64_t remaining = partitions; remaining > 1; --remaining) {
    const int64_t stop = n - (remaining - 1);  // the block must end at or before this
    int64_t end = begin;
    int64_t block = 0;
    while (end < stop && (end == begin || block <= limit - costs[end])) block += costs[end++];
    sizes.push_back(end - begin);
    begin = end;
  }
  sizes.push_back(n - begin);
  return sizes;
}

}  // namespace balance
}  // namespace gpipe

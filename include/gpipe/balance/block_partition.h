// Block partition: split a sequence of costs into contiguous blocks so that the largest block
// cost is as small as possible (the "linear partition" problem), exactly.
#pragma once

#include <cstdint>
#include <vector>

namespace gpipe {
namespace balance {

/// The sizes of `partitions` contiguous, non-empty blocks of `costs` whose largest block cost
/// (sum of its costs) is the smallest possible. Among optimal partitions the one with the
/// lexicographically largest sizes is returned (earlier blocks take as many items as possible),
/// so the result is unique. Exact: binary search on the largest block cost with a greedy
/// feasibility test, O(n log(sum of costs)). The result is a GPipe balance.
///
/// Throws c10::ValueError if partitions < 1, if costs has fewer than `partitions` items, or if a
/// cost is negative or the costs overflow int64.
///
/// Example:
///   gpipe::balance::block_partition({1, 2, 3, 4, 5, 6}, 2);  // {4, 2}: blocks cost 10 and 11
std::vector<int64_t> block_partition(const std::vector<int64_t>& costs, int64_t partitions);
}  // namespace balance
}  // namespace gpipe

// The one check of a partition count that every balancing function makes first.
#pragma once

#include <cstdint>

namespace gpipe {
namespace balance {
namespace detail {

/// Throws c10::ValueError unless 0 < partitions <= items (the messages of block_partition).
void check_partitions(int64_t items, int64_t partitions);

}  // namespace detail
}  // namespace balance
}  // namespace gpipe

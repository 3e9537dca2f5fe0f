#include "balance/check_partitions.h"

#include <c10/util/Exception.h>

namespace gpipe {
namespace balance {
namespace detail {

void check_partitions(int64_t items, int64_t partitions) {
  TORCH_CHECK_VALUE(partitions >= 1, "partitions must be a positive integer (", partitions,
                    " < 1)");
  TORCH_CHECK_VALUE(items >= partitions, "sequence is shorter than intended partitions (", items,
                    " < ", partitions, ")");
}

}  // namespace detail
}  // namespace balance
}  // namespace gpipe

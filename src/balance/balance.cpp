#include "gpipe/balance/balance.h"

namespace gpipe {
namespace balance {

std::vector<int64_t> balance_by_time(int64_t partitions, torch::nn::Sequential module,
                                     const Batch& sample, const BalanceByTimeOptions& options) {
  detail::check_partitions(static_cast<int64_t>(module->size()), partitions);  // before profiling
  return block_partition(profile_times(module, sample, options), partitions);
}

std::vector<int64_t> balance_by_size(int64_t partitions, torch::nn::Sequential module,
                                     const Batch& sample, const BalanceBySizeOptions& options) {
  detail::check_partitions(static_cast<int64_t>(module->size()), partitions);
  return block_partition(profile_sizes(module, sample, options), partitions);
}

}  // namespace balance
}  // namespace gpipe

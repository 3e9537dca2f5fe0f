#include "gpipe/balance/balance.h"

#include "balance/check_partitions.h"

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

std::vector<int64_t> balance_by_count(int64_t partitions, int64_t layers) {
  detail::check_partitions(layers, partitions);
  std::vector<int64_t> balance(static_cast<size_t>(partitions), layers / partitions);
  for (int64_t k = 0; k < layers % partitions; ++k) ++balance[static_cast<size_t>(k)];
  return balance;
}

}  // namespace balance
}  // namespace gpipe

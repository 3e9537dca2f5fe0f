// Automatic balancing: how many consecutive layers of a Sequential each GPipe partition should
// take, from profiled per-layer time or memory, by an optimal block partition.
//
// Example:
//   auto sample = torch::randn({128, 3, 224, 224});
//   auto balance = gpipe::balance::balance_by_time(4, sequential, sample);
//   gpipe::GPipe model(sequential, gpipe::GPipeOptions(balance).chunks(8));
#pragma once

#include "gpipe/balance/block_partition.h"
#include "gpipe/balance/profile.h"
#include "gpipe/microbatch.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <vector>

namespace gpipe {
namespace balance {

/// The balance into `partitions` that minimises the slowest partition's forward and backward
/// time, as profiled by profile_times(). The model is left as it was.
///
/// Throws c10::ValueError if partitions < 1 or the module has fewer layers ("partitions must be
/// a positive integer (0 < 1)", "sequence is shorter than intended partitions (1 < 2)"), and as
/// profile_times() does ("some parameter already has gradient").
std::vector<int64_t> balance_by_time(int64_t partitions, torch::nn::Sequential module,
                                     const Batch& sample, const BalanceByTimeOptions& options = {});

/// `layers` layers split into `partitions` as evenly as counts allow, the first partitions taking
/// one more where it does not divide: balance_by_count(3, 8) is {3, 3, 2}. For layers of equal
/// cost, without profiling. Throws c10::ValueError as balance_by_time() does.
std::vector<int64_t> balance_by_count(int64_t partitions, int64_t layers);

/// The balance into `partitions` that minimises the largest partition's training memory, as
/// profiled by profile_sizes(). Pass the whole mini-batch as `sample` and the chunks GPipe
/// will use. The model is left as it was. Throws c10::ValueError as balance_by_time() does.
std::vector<int64_t> balance_by_size(int64_t partitions, torch::nn::Sequential module,
                                     const Batch& sample, const BalanceBySizeOptions& options = {});

}  // namespace balance
}  // namespace gpipe

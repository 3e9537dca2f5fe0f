// Splitting a Sequential by a balance: where every engine (GPipe, schedule::PipelineSchedule,
// distributed::PipelineStage) turns the user's model and balance into its stages, with one set
// of checks and messages.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <vector>

namespace gpipe {
namespace detail {

/// Throws c10::ValueError unless `balance` splits `module` into stages of at least one layer
/// each, with torchgpipe's messages: "module and sum of balance have different length (module:
/// 2, sum of balance: 3)" (the sum exact, never wrapped) or "all balance numbers must be
/// positive integer (balance: [0, 2])", each followed by how to measure a balance instead.
void check_balance(const torch::nn::Sequential& module, const std::vector<int64_t>& balance);

/// `module`'s layers in order, balance[j] of them to stage j, after check_balance. Each stage is
/// a Sequential that keeps the layers' names; the layers are shared with `module`, not copied.
std::vector<torch::nn::Sequential> split_by_balance(const torch::nn::Sequential& module,
                                                    const std::vector<int64_t>& balance);

}  // namespace detail
}  // namespace gpipe

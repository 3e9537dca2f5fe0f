#include "detail/split.h"

#include "detail/exact.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

namespace gpipe {
namespace detail {
namespace {

// Appended to balance errors: the balance is easiest found by measuring.
constexpr const char* kAutoBalanceAdvice =
    "\n\nIf your model is still changing, let gpipe::balance find the balance:\n"
    "  auto balance = gpipe::balance::balance_by_time(partitions, sequential, sample);";

}  // namespace

void check_balance(const torch::nn::Sequential& module, const std::vector<int64_t>& balance) {
  const Exact total = exact_sum(balance);
  TORCH_CHECK_VALUE(static_cast<Exact>(module->size()) == total,
                    "module and sum of balance have different length (module: ", module->size(),
                    ", sum of balance: ", to_string(total), ")", kAutoBalanceAdvice);
  TORCH_CHECK_VALUE(std::all_of(balance.begin(), balance.end(), [](int64_t b) { return b > 0; }),
                    "all balance numbers must be positive integer (balance: ",
                    c10::ArrayRef<int64_t>(balance), ")", kAutoBalanceAdvice);
}

std::vector<torch::nn::Sequential> split_by_balance(const torch::nn::Sequential& module,
                                                    const std::vector<int64_t>& balance) {
  check_balance(module, balance);
  const auto names = module->named_children().keys();
  std::vector<torch::nn::Sequential> stages;
  size_t layer = 0;
  auto any_layer = module->begin();  // AnyModules: each keeps its layer's own forward
  for (const int64_t count : balance) {
    torch::nn::Sequential stage;
    for (int64_t k = 0; k < count; ++k, ++layer, ++any_layer) {
      stage->push_back(names[layer], *any_layer);
    }
    stages.push_back(stage);
  }
  return stages;
}

}  // namespace detail
}  // namespace gpipe

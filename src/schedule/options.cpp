#include "gpipe/schedule/options.h"

#include "detail/enum_names.h"

namespace gpipe {
namespace schedule {

namespace {

constexpr gpipe::detail::EnumName<LossReduction> kLossReductions[] = {
    {LossReduction::kMean, "mean"}, {LossReduction::kSum, "sum"}};

}  // namespace

std::ostream& operator<<(std::ostream& out, LossReduction reduction) {
  return gpipe::detail::print_name(out, reduction, kLossReductions, "LossReduction");
}

}  // namespace schedule
}  // namespace gpipe

#include "gpipe/schedule/options.h"

namespace gpipe {
namespace schedule {

std::ostream& operator<<(std::ostream& out, LossReduction reduction) {
  switch (reduction) {
    case LossReduction::kMean:
      return out << "mean";
    case LossReduction::kSum:
      return out << "sum";
  }
  return out << "LossReduction(" << static_cast<int>(reduction) << ")";
}

}  // namespace schedule
}  // namespace gpipe

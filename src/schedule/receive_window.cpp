#include "schedule/receive_window.h"

#include "gpipe/schedule/predict.h"

#include <algorithm>

namespace gpipe {
namespace schedule {
namespace detail {

int64_t automatic_receive_window(const Schedule& schedule) {
  const auto live =
      predict(schedule, ActionCosts::unit(schedule.num_stages)).peak_live_microbatches;
  return std::max<int64_t>(1, *std::max_element(live.begin(), live.end()));
}

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

// What every generator (generators.h) checks of its counts before it builds a schedule: that they
// are positive, and that the schedule fits what a schedule can hold.
//
// Internal to the generators. Thread safety: pure functions.
#pragma once

#include "detail/exact.h"

#include <c10/util/Exception.h>

#include <cstdint>

namespace gpipe {
namespace schedule {
namespace detail {

/// Throws c10::ValueError naming `name` unless `value` is positive.
inline void check_positive(int64_t value, const char* name) {
  TORCH_CHECK_VALUE(value > 0, name, " must be positive, but got ", value);
}

/// A schedule holds a few actions per (stage, micro-batch): what no memory could hold is refused
/// before trying to build it.
constexpr int64_t kMaxCells = int64_t{1} << 32;

/// Checks the counts of a schedule of `num_stages` stages and `num_microbatches` micro-batches.
inline void check_size(int64_t num_stages, int64_t num_microbatches) {
  check_positive(num_stages, "num_stages");
  check_positive(num_microbatches, "num_microbatches");
  const gpipe::detail::Exact cells = gpipe::detail::Exact(num_stages) * num_microbatches;
  TORCH_CHECK_VALUE(cells <= kMaxCells, "a schedule of ", num_stages, " stages and ",
                    num_microbatches, " micro-batches has ", gpipe::detail::to_string(cells),
                    " (stage, micro-batch) cells, more than the ", kMaxCells,
                    " a schedule can hold");
}

/// Checks the counts of a V (action.h): `num_workers` workers with 2 stages each.
inline void check_v_size(int64_t num_workers, int64_t num_microbatches) {
  check_positive(num_workers, "num_workers");
  TORCH_CHECK_VALUE(num_workers <= kMaxCells / 2, num_workers,
                    " workers with 2 stages each make more than the ", kMaxCells,
                    " stages a schedule can hold");
  check_size(2 * num_workers, num_microbatches);
}

/// Checks the counts of a schedule of `num_workers` workers with `stages_per_worker` looped
/// stages each.
inline void check_stages(int64_t num_workers, int64_t stages_per_worker, int64_t num_microbatches) {
  check_positive(num_workers, "num_workers");
  check_positive(stages_per_worker, "stages_per_worker");
  const gpipe::detail::Exact stages = gpipe::detail::Exact(num_workers) * stages_per_worker;
  TORCH_CHECK_VALUE(stages <= kMaxCells, num_workers, " workers with ", stages_per_worker,
                    " stages each make ", gpipe::detail::to_string(stages),
                    " stages, more than the ", kMaxCells, " a schedule can hold");
  check_size(static_cast<int64_t>(stages), num_microbatches);
}

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

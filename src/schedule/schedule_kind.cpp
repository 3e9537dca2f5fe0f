#include "gpipe/schedule/schedule_kind.h"

#include "detail/enum_names.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace gpipe {
namespace schedule {
namespace {

// Every kind with its name, in the order of ScheduleKind.
constexpr gpipe::detail::EnumName<ScheduleKind> kScheduleKinds[] = {
    {ScheduleKind::kGPipe, "gpipe"},
    {ScheduleKind::kOneFOneB, "1f1b"},
    {ScheduleKind::kInterleavedOneFOneB, "interleaved_1f1b"},
    {ScheduleKind::kZeroBubble, "zb1p"},
    {ScheduleKind::kZeroBubbleV, "zbv"},
    {ScheduleKind::kInterleavedZeroBubble, "interleaved_zb1p"},
    {ScheduleKind::kLoopedBFS, "looped_bfs"},
    {ScheduleKind::kDualPipeV, "dualpipev"},
    {ScheduleKind::kVMin, "v_min"},
    {ScheduleKind::kVHalf, "v_half"}};

}  // namespace

std::ostream& operator<<(std::ostream& out, ScheduleKind kind) {
  return gpipe::detail::print_name(out, kind, kScheduleKinds, "ScheduleKind");
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  const auto kind = gpipe::detail::value_named(name, kScheduleKinds);
  TORCH_CHECK_VALUE(kind, "unknown schedule kind '", name, "' (expected ",
                    c10::Join(", ", schedule_names()), ")");
  return *kind;
}

std::vector<ScheduleKind> all_schedule_kinds() {
  std::vector<ScheduleKind> kinds;
  for (const auto& row : kScheduleKinds) kinds.push_back(row.value);
  return kinds;
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (const auto& row : kScheduleKinds) names.emplace_back(row.name);
  return names;
}

std::vector<ScheduleKind> schedule_kinds_where(const std::function<bool(ScheduleKind)>& has) {
  std::vector<ScheduleKind> kinds;
  for (const auto kind : all_schedule_kinds()) {
    if (has(kind)) kinds.push_back(kind);
  }
  return kinds;
}

std::string schedule_name_list(const std::vector<ScheduleKind>& kinds, const std::string& last) {
  std::string text;
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (k > 0) text += k + 1 == kinds.size() ? " " + last + " " : ", ";
    text += c10::str(kinds[k]);
  }
  return text;
}

Placement placement_of(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleV || kind == ScheduleKind::kDualPipeV ||
                 kind == ScheduleKind::kVMin || kind == ScheduleKind::kVHalf
             ? Placement::kV
             : Placement::kLooped;
}

bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubble || kind == ScheduleKind::kZeroBubbleV ||
         kind == ScheduleKind::kInterleavedZeroBubble || kind == ScheduleKind::kDualPipeV ||
         kind == ScheduleKind::kVMin || kind == ScheduleKind::kVHalf;
}

bool loops_stages(ScheduleKind kind) {
  return kind == ScheduleKind::kInterleavedOneFOneB ||
         kind == ScheduleKind::kInterleavedZeroBubble || kind == ScheduleKind::kLoopedBFS;
}

int64_t min_microbatches(ScheduleKind kind, int64_t num_stages) {
  // DualPipeV's steady state starts only once every stage has a micro-batch.
  return kind == ScheduleKind::kDualPipeV ? num_stages : 1;
}

void check_schedule_options(ScheduleKind kind, int64_t stages_per_worker, CheckpointMode checkpoint,
                            const ScheduleOptionNames& names) {
  TORCH_CHECK_VALUE(stages_per_worker > 0, names.stages_per_worker, " must be positive, but got ",
                    stages_per_worker);
  if (placement_of(kind) == Placement::kV) {
    TORCH_CHECK_VALUE(stages_per_worker == 2, names.schedule, " ", kind, " runs two stages per ",
                      names.worker, " in a V, but ", names.stages_per_worker, " is ",
                      stages_per_worker, " (set it to 2)");
  } else {
    TORCH_CHECK_VALUE(stages_per_worker == 1 || loops_stages(kind), names.schedule, " ", kind,
                      " runs one stage per ", names.worker, ", but ", names.stages_per_worker,
                      " is ", stages_per_worker, " (more than 1 only with ",
                      schedule_name_list(schedule_kinds_where(loops_stages)), "; 2 with ",
                      schedule_name_list(schedule_kinds_where(
                          [](ScheduleKind k) { return placement_of(k) == Placement::kV; })),
                      ")");
  }
  // A checkpoint's recomputation runs inside one autograd node, which has no split point
  // between the input's and the parameters' gradients.
  TORCH_CHECK_VALUE(
      checkpoint == CheckpointMode::kNever || !splits_backward(kind), names.schedule, " ", kind,
      " splits each backward into input and weight gradients, which ", names.checkpoint,
      " cannot: use ", names.checkpoint, " with ",
      schedule_name_list(schedule_kinds_where([](ScheduleKind k) { return !splits_backward(k); }),
                         "or"));
}

}  // namespace schedule
}  // namespace gpipe

// ScheduleKind: the schedules gpipe generates, their names, and the rules that tell them apart
// (placement, split backwards, looped stages, fewest micro-batches), which the engines, the
// command, the messages and the documents all take from here.
//
// Thread safety: pure functions.
#pragma once

#include "gpipe/checkpoint.h"
#include "gpipe/schedule/action.h"

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace gpipe {
namespace schedule {

/// The schedules the generators produce.
enum class ScheduleKind {
  kGPipe,                  ///< fill-drain: all forwards, then all backwards
  kOneFOneB,               ///< one forward, one backward (PipeDream-Flush)
  kInterleavedOneFOneB,    ///< 1F1B with several virtual stages per worker
  kZeroBubble,             ///< ZB1P: 1F1B with backward split, weight gradients fill the bubbles
  kZeroBubbleV,            ///< ZBV: two stages per worker in a V, backward split as in ZB1P
  kInterleavedZeroBubble,  ///< interleaved ZB1P: interleaved 1F1B's stages, backward split
  kLoopedBFS,              ///< looped BFS: interleaved stages, each stage's forwards all at once
  kDualPipeV,              ///< DualPipeV: ZBV's V, forwards paired with backwards (DeepSeek)
  kVMin,                   ///< V-Min: ZBV's V holding about a third of 1F1B's activations
  kVHalf,                  ///< V-Half: ZBV's V holding about half of 1F1B's activations
};

std::ostream& operator<<(std::ostream& out, ScheduleKind kind);

/// Parses "gpipe", "1f1b", "interleaved_1f1b", "zb1p", "zbv", "interleaved_zb1p", "looped_bfs",
/// "dualpipev", "v_min" or "v_half". Throws c10::ValueError for anything else.
ScheduleKind parse_schedule_kind(const std::string& name);

/// Every name parse_schedule_kind accepts, in the order of ScheduleKind.
std::vector<std::string> schedule_names();

/// Where the schedules of `kind` place their stages: kV for kZeroBubbleV, kDualPipeV, kVMin and
/// kVHalf, else kLooped. (The rules below answer "which schedules ...": messages and documents list
/// kinds through them, with schedule_kinds_where, so that no list goes stale.)
Placement placement_of(ScheduleKind kind);

/// True for the schedules that split each backward into kBackwardInput and kBackwardWeight.
bool splits_backward(ScheduleKind kind);

/// True for the schedules of any number of looped stages per worker: interleaved 1F1B and ZB1P,
/// looped BFS.
bool loops_stages(ScheduleKind kind);

/// The fewest micro-batches the schedules of `kind` run over `num_stages` stages: num_stages for
/// kDualPipeV, 1 for the others.
int64_t min_microbatches(ScheduleKind kind, int64_t num_stages);

/// The names a caller knows the options of check_schedule_options by, for its messages (e.g. a
/// command's flags).
struct ScheduleOptionNames {
  std::string schedule = "schedule";
  std::string stages_per_worker = "stages_per_worker";
  std::string worker = "worker";
  std::string checkpoint = "checkpoint";
};

/// The rules every engine and the command apply to a schedule's options: stages_per_worker is
/// positive, 2 where placement_of() is kV, and more than 1 only there and for the loops_stages()
/// kinds; checkpointing is not for the kinds that splits_backward(), which leave no place for a
/// recomputation. Throws c10::ValueError naming the options by `names` and the kinds each rule
/// allows.
void check_schedule_options(ScheduleKind kind, int64_t stages_per_worker, CheckpointMode checkpoint,
                            const ScheduleOptionNames& names = {});

/// Every kind, in the order of ScheduleKind.
std::vector<ScheduleKind> all_schedule_kinds();

/// The kinds for which `has` holds, in the order of ScheduleKind.
std::vector<ScheduleKind> schedule_kinds_where(const std::function<bool(ScheduleKind)>& has);

/// The kinds' names as a phrase: "zbv and dualpipev", "interleaved_1f1b, interleaved_zb1p and
/// looped_bfs"; `last` joins the last two ("or": "gpipe, 1f1b or looped_bfs").
std::string schedule_name_list(const std::vector<ScheduleKind>& kinds,
                               const std::string& last = "and");

}  // namespace schedule
}  // namespace gpipe

// Schedules as text: a schedule a user writes by hand, or brings over from PyTorch's
// torch.distributed.pipelining, read into a Schedule (action.h) that both engines run.
//
// The text holds one line per worker, in order: its actions, separated by spaces or commas, each
// in PyTorch's compact notation <stage><kind><micro-batch> (action.h: compact, parse_action), so
// "2F1" is the forward of micro-batch 1 on stage 2 and "1I0" the input half of the backward of
// micro-batch 0 on stage 1. A line may start with "worker N:" (N its position), '#' starts a
// comment, and blank lines are skipped. Example, 1F1B on 2 stages:
//
//   worker 0: 0F0 0F1 0B0 0F2 0B1 0B2
//   worker 1: 1F0 1B0 1F1 1B1 1F2 1B2
//
// The numbers of workers (lines), stages and micro-batches are what the text uses. Which worker
// runs which stage must be one of the placements of action.h (looped or V). A text of compute
// actions only gets its sends and receives as the generators place them (with_communication,
// generators.h); one that has any (PyTorch's lowered CSV files do) must have them all. A file
// written for torch.distributed.pipelining (one rank per row, actions separated by commas) reads
// as it is.
//
// Thread safety: pure functions.
#pragma once

#include "gpipe/schedule/action.h"

#include <string>

namespace gpipe {
namespace schedule {

/// Parses `text` and validates the schedule (validate.h). Throws c10::ValueError naming
/// `source`, the line and the action: an unknown action, a worker label out of order, a stage
/// run by two workers or placed neither looped nor in a V, missing communication, or what
/// validate() rejects (a deadlock, a missing backward, ...), with each worker named by its line.
Schedule parse_schedule(const std::string& text, const std::string& source = "schedule");

/// parse_schedule() of the file at `path`. Throws c10::ValueError if it cannot be read.
Schedule read_schedule_file(const std::string& path);

/// The text parse_schedule() reads back into `schedule`: compute actions only where its sends
/// and receives are those with_communication() places, else every action.
std::string write_schedule(const Schedule& schedule);

}  // namespace schedule
}  // namespace gpipe

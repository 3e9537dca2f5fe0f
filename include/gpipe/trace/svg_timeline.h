// The SVG timeline writer: a timeline as a picture, a row per worker and a box per task.
#pragma once

#include "gpipe/trace/event.h"

#include <ostream>
#include <vector>

namespace gpipe {
namespace trace {

/// Writes `events` as an SVG timeline: a row per worker (per rank, where they come from several
/// ranks), a box per task, colored by kind and labeled with its micro-batch where it fits
/// (stage:micro-batch where a worker runs several stages); recomputations are drawn over the
/// backwards they run in, transfers over both.
void write_svg_timeline(const std::vector<Event>& events, std::ostream& out);

}  // namespace trace
}  // namespace gpipe

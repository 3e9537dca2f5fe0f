#include "gpipe/trace/svg_timeline.h"

#include "trace/fixed.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace gpipe {
namespace trace {
namespace {

// Event names are identifiers, but a caller may record anything: escape what XML needs.
std::string xml_escaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

const char* color_of(const std::string& name) {
  if (name == "forward") return "#4e79a7";
  if (name == "backward") return "#f28e2b";
  if (name == "backward_input") return "#e15759";
  if (name == "backward_weight") return "#edc948";
  if (name == "recompute") return "#59a14f";
  return "#bab0ac";  // transfers and anything else
}

}  // namespace

void write_svg_timeline(const std::vector<Event>& events, std::ostream& out) {
  constexpr double kLeft = 80, kWidth = 1000, kRow = 30, kTop = 30;
  using Row = std::pair<int64_t, int64_t>;  // (rank, worker)
  std::set<Row> row_set;
  double t0 = 0, t1 = 1;
  if (!events.empty()) {
    t0 = events.front().begin_us;
    t1 = events.front().end_us;
  }
  for (const auto& e : events) {
    row_set.insert({e.rank, e.worker});
    t0 = std::min(t0, e.begin_us);
    t1 = std::max(t1, e.end_us);
  }
  const std::vector<Row> rows(row_set.begin(), row_set.end());
  const double span = std::max(t1 - t0, 1e-3);
  const auto x = [&](double t) { return kLeft + (t - t0) / span * kWidth; };
  const auto row_of = [&](const Event& e) {
    return static_cast<double>(std::lower_bound(rows.begin(), rows.end(), Row{e.rank, e.worker}) -
                               rows.begin());
  };
  const double height = kTop + kRow * static_cast<double>(rows.size()) + 72;

  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kLeft + kWidth + 20
      << "\" height=\"" << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kLeft << "\" y=\"18\" font-size=\"13\">gpipe timeline: " << events.size()
      << " tasks, " << fixed(span / 1000, 2) << " ms</text>\n";
  // A row is a worker; the ranks of a multi-process pipeline name theirs (one worker each, or
  // "rank:worker" where a rank has several).
  const bool ranked = from_ranks(events);
  std::map<int64_t, int64_t> workers_of_rank;
  for (const Row& row : rows) ++workers_of_rank[row.first];
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto [rank, worker] = rows[r];
    const double y = kTop + kRow * static_cast<double>(r);
    const std::string name = !ranked ? "worker " + std::to_string(worker)
                             : workers_of_rank[rank] == 1
                                 ? "rank " + std::to_string(rank)
                                 : "rank " + std::to_string(rank) + ":" + std::to_string(worker);
    out << "<text x=\"4\" y=\"" << y + kRow / 2 + 4 << "\">" << name << "</text>\n"
        << "<line x1=\"" << kLeft << "\" y1=\"" << y + kRow << "\" x2=\"" << kLeft + kWidth
        << "\" y2=\"" << y + kRow << "\" stroke=\"#ddd\"/>\n";
  }
  // A worker that runs several stages (interleaved schedules) labels its boxes stage:micro-batch.
  std::map<Row, std::set<int64_t>> stages_of;
  for (const auto& e : events) stages_of[{e.rank, e.worker}].insert(e.stage);
  const bool several_stages =
      std::any_of(stages_of.begin(), stages_of.end(),
                  [](const auto& entry) { return entry.second.size() > 1; });
  // Compute fills the row. Recomputations (which run inside their backward) and transfers are
  // drawn in a second pass, over the compute boxes: a recompute in the lower third of its
  // backward, a transfer as a thin strip on top.
  const auto draw = [&](const Event& e) {
    const double row_top = kTop + kRow * row_of(e);
    const bool compute = is_compute(e);
    const double y = compute                 ? row_top + 2
                     : e.name == "recompute" ? row_top + kRow * 2 / 3
                                             : row_top;
    const double h = compute ? kRow - 4 : e.name == "recompute" ? kRow / 3 - 2 : 3;
    const double left = x(e.begin_us);
    const double width = std::max(x(e.end_us) - left, 0.5);
    out << "<rect x=\"" << fixed(left, 2) << "\" y=\"" << y << "\" width=\"" << fixed(width, 2)
        << "\" height=\"" << h << "\" fill=\"" << color_of(e.name) << "\" stroke=\"white\""
        << " stroke-width=\"0.5\"><title>" << xml_escaped(e.name) << " stage " << e.stage
        << " micro-batch " << e.microbatch << " step " << e.step << ": "
        << fixed((e.end_us - e.begin_us) / 1000, 3) << " ms</title></rect>\n";
    const std::string label = several_stages
                                  ? std::to_string(e.stage) + ":" + std::to_string(e.microbatch)
                                  : std::to_string(e.microbatch);
    if (compute && width >= 7.0 * static_cast<double>(label.size())) {
      out << "<text x=\"" << fixed(left + width / 2, 2) << "\" y=\"" << row_top + kRow / 2 + 4
          << "\" text-anchor=\"middle\" fill=\"white\">" << label << "</text>\n";
    }
  };
  for (const auto& e : events) {
    if (is_compute(e)) draw(e);
  }
  for (const auto& e : events) {
    if (!is_compute(e)) draw(e);
  }
  // Time axis and legend.
  const double axis = kTop + kRow * static_cast<double>(rows.size()) + 14;
  for (int tick = 0; tick <= 4; ++tick) {
    const double t = t0 + span * tick / 4;
    // The last label ends at the axis' end, so that it stays inside the picture.
    out << "<text x=\"" << fixed(x(t), 2) << "\" y=\"" << axis << "\" text-anchor=\""
        << (tick == 4 ? "end" : "middle") << "\">" << fixed((t - t0) / 1000, 1) << " ms</text>\n";
  }
  double legend_x = kLeft;
  for (const char* name :
       {"forward", "backward", "backward_input", "backward_weight", "recompute", "send/recv"}) {
    out << "<rect x=\"" << legend_x << "\" y=\"" << axis + 14 << "\" width=\"12\" height=\"12\""
        << " fill=\"" << color_of(name) << "\"/><text x=\"" << legend_x + 16 << "\" y=\""
        << axis + 24 << "\">" << name << "</text>\n";
    legend_x += 130;
  }
  out << "<text x=\"" << kLeft << "\" y=\"" << axis + 46
      << "\">box labels: " << (several_stages ? "stage:micro-batch" : "micro-batch") << "</text>\n";
  out << "</svg>\n";
}

}  // namespace trace
}  // namespace gpipe

#include "gpipe/schedule/schedule_file.h"

#include "detail/message_of.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/validate.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {
namespace {

// parse_action() of `token`, its errors prefixed with `where`.
Action parse_action_at(const std::string& token, const std::string& where) {
  try {
    return parse_action(token);
  } catch (const c10::ValueError& error) {
    TORCH_CHECK_VALUE(false, where, gpipe::detail::message_of(error));
  }
}

// The placement under which worker w runs every stage of `worker_of_stage` (stage -> worker), or
// c10::ValueError naming a stage that fits neither.
Placement infer_placement(const std::map<int64_t, int64_t>& worker_of_stage, int64_t W, int64_t S,
                          const std::vector<int64_t>& lines, const std::string& source) {
  std::optional<int64_t> not_looped, not_v;
  for (const auto& [s, w] : worker_of_stage) {
    if (!not_looped && worker_of(Placement::kLooped, s, W) != w) not_looped = s;
    if (!not_v && (S != 2 * W || worker_of(Placement::kV, s, W) != w)) not_v = s;
  }
  if (!not_looped) return Placement::kLooped;
  if (!not_v) return Placement::kV;
  const auto on = [&](int64_t s) {
    const int64_t w = worker_of_stage.at(s);
    return c10::str("stage ", s, " on line ", lines[w], " (worker ", w, ")");
  };
  TORCH_CHECK_VALUE(false, source, ": the stages are placed neither looped (stage s on worker s % ",
                    W, ") nor in a V (", 2 * W, " stages, worker w running stages w and ",
                    2 * W - 1, " - w): ", on(*not_looped), " breaks the first, ",
                    S != 2 * W ? c10::str(S, " stages the second") : on(*not_v) + " the second");
}

}  // namespace

Schedule parse_schedule(const std::string& text, const std::string& source) {
  std::vector<std::vector<Action>> actions;
  std::vector<int64_t> lines;  // the line of each worker, from 1
  std::istringstream in(text);
  std::string line;
  for (int64_t number_of_line = 1; std::getline(in, line); ++number_of_line) {
    line = line.substr(0, line.find('#'));
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream words(line);
    std::string word;
    if (!(words >> word)) continue;
    const int64_t w = static_cast<int64_t>(actions.size());
    const std::string where = c10::str(source, ", line ", number_of_line, ": ");
    if (word == "worker") {
      std::string label;
      words >> label;
      const std::string expected = c10::str(w, ":");
      TORCH_CHECK_VALUE(label == expected, where, "'worker ", label, "' labels the line of worker ",
                        w, ", which reads 'worker ", expected,
                        "' (lines of actions are workers 0, 1, ... in order)");
    } else {
      words.clear();
      words.seekg(0);  // the word was an action
    }
    actions.emplace_back();
    lines.push_back(number_of_line);
    while (words >> word) actions.back().push_back(parse_action_at(word, where));
  }
  TORCH_CHECK_VALUE(!actions.empty(), source, " holds no actions");

  const auto W = static_cast<int64_t>(actions.size());
  int64_t S = 0, M = 0;
  bool communicates = false;
  std::map<int64_t, int64_t> worker_of_stage;
  std::set<std::pair<int64_t, int64_t>> weighted;  // (stage, micro-batch) with a W
  for (const auto w : c10::irange(W)) {
    for (const Action& a : actions[w]) {
      S = std::max(S, a.stage + 1);
      M = std::max(M, a.microbatch + 1);
      communicates = communicates || !is_compute(a.kind);
      if (a.kind == ActionKind::kBackwardWeight) weighted.emplace(a.stage, a.microbatch);
      const auto [it, added] = worker_of_stage.emplace(a.stage, w);
      TORCH_CHECK_VALUE(added || it->second == w, source, ": stage ", a.stage, " has actions on ",
                        "line ", lines[it->second], " (worker ", it->second, ") and on line ",
                        lines[w], " (worker ", w, "), but a stage runs on one worker");
    }
  }
  // Files of older PyTorch versions write the input half of a split backward as B.
  for (auto& list : actions) {
    for (Action& a : list) {
      if (a.kind == ActionKind::kBackward && weighted.count({a.stage, a.microbatch})) {
        a.kind = ActionKind::kBackwardInput;
      }
    }
  }
  Schedule schedule{W, S, M, infer_placement(worker_of_stage, W, S, lines, source),
                    std::move(actions)};
  if (!communicates) schedule = with_communication(schedule);

  std::vector<std::string> names;
  for (const auto w : c10::irange(W))
    names.push_back(c10::str("line ", lines[w], " (worker ", w, ")"));
  try {
    validate(schedule, ValidateOptions().worker_names(names));
  } catch (const c10::ValueError& error) {
    TORCH_CHECK_VALUE(false, source, ": ", gpipe::detail::message_of(error));
  }
  return schedule;
}

Schedule read_schedule_file(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), "cannot read the schedule file ", path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_schedule(text.str(), path);
}

std::string write_schedule(const Schedule& schedule) {
  Schedule computes = schedule;
  for (auto& list : computes.actions) {
    list.erase(std::remove_if(list.begin(), list.end(),
                              [](const Action& a) { return !is_compute(a.kind); }),
               list.end());
  }
  const bool implied = with_communication(computes).actions == schedule.actions;
  const Schedule& written = implied ? computes : schedule;
  std::ostringstream out;
  out << "# " << schedule.num_workers << " workers, " << schedule.num_stages << " stages ("
      << schedule.placement << "), " << schedule.num_microbatches << " micro-batches"
      << (implied ? "; sends and receives as the generators place them" : "") << "\n";
  for (const auto w : c10::irange(written.actions.size())) {
    out << "worker " << w << ":";
    for (const Action& a : written.actions[w]) out << ' ' << compact(a);
    out << '\n';
  }
  return out.str();
}

}  // namespace schedule
}  // namespace gpipe

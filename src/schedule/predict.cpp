#include "gpipe/schedule/predict.h"

#include "gpipe/schedule/validate.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <utility>

namespace gpipe {
namespace schedule {
namespace {

void check_costs(const std::vector<double>& costs, int64_t num_stages, const char* name) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(costs.size()) >= num_stages, "costs: ", name, " has ",
                    costs.size(), " entries for ", num_stages, " stages");
  for (const auto s : c10::irange(num_stages)) {
    TORCH_CHECK_VALUE(costs[s] >= 0, "costs: ", name, " of stage ", s, " is negative (", costs[s],
                      ")");
  }
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace

ActionCosts ActionCosts::unit(int64_t num_stages) {
  ActionCosts costs;
  costs.forward.assign(num_stages, 1);
  costs.backward.assign(num_stages, 2);
  costs.backward_input.assign(num_stages, 1);
  costs.backward_weight.assign(num_stages, 1);
  return costs;
}

Prediction predict(const Schedule& schedule, const ActionCosts& costs) {
  const Timeline timeline = simulate(schedule);  // validates; counts what each stage holds
  const int64_t S = schedule.num_stages;
  check_costs(costs.forward, S, "forward");
  check_costs(costs.backward, S, "backward");
  check_costs(costs.backward_input, S, "backward_input");
  check_costs(costs.backward_weight, S, "backward_weight");
  TORCH_CHECK_VALUE(costs.latency >= 0 && costs.seconds_per_byte >= 0,
                    "costs: latency and seconds_per_byte must be non-negative, but are ",
                    costs.latency, " and ", costs.seconds_per_byte);
  TORCH_CHECK_VALUE(
      costs.message_bytes.empty() || static_cast<int64_t>(costs.message_bytes.size()) >= S,
      "costs: message_bytes has ", costs.message_bytes.size(), " entries for ", S, " stages");
  TORCH_CHECK_VALUE(costs.receive_window >= 0,
                    "costs: receive_window must be non-negative, but is ", costs.receive_window);

  const int64_t W = schedule.num_workers;
  Prediction prediction;
  prediction.begin.resize(W);
  prediction.end.resize(W);
  prediction.busy.assign(W, 0);
  for (const auto w : c10::irange(W)) {
    prediction.begin[w].resize(schedule.actions[w].size());
    prediction.end[w].resize(schedule.actions[w].size());
  }
  // Per edge (from, to): when its messages were sent and how long each takes once on its way,
  // in the order sent; when each receive ended.
  struct Edge {
    std::deque<std::pair<double, double>> sent;  // (time, transfer)
    std::vector<double> received;
  };
  std::map<std::pair<int64_t, int64_t>, Edge> edges;
  const int64_t window = costs.receive_window;
  std::vector<double> clock(W, 0);
  std::vector<size_t> next(W, 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (const auto w : c10::irange(W)) {
      const auto& actions = schedule.actions[w];
      for (; next[w] < actions.size(); ++next[w], progressed = true) {
        const Action& a = actions[next[w]];
        const double begin = clock[w];
        if (is_compute(a.kind)) {
          const auto& cost = a.kind == ActionKind::kForward         ? costs.forward
                             : a.kind == ActionKind::kBackward      ? costs.backward
                             : a.kind == ActionKind::kBackwardInput ? costs.backward_input
                                                                    : costs.backward_weight;
          clock[w] += cost[a.stage];
          prediction.busy[w] += cost[a.stage];
        } else if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient) {
          const int64_t to = a.kind == ActionKind::kSendActivation ? a.stage + 1 : a.stage - 1;
          // A gradient is as large as the activation it belongs to, sent by the lower stage.
          const int64_t bytes =
              costs.message_bytes.empty() ? 0 : costs.message_bytes[std::min(a.stage, to)];
          const double transfer =
              schedule.worker_of(to) == w
                  ? 0
                  : costs.latency + static_cast<double>(bytes) * costs.seconds_per_byte;
          edges[{a.stage, to}].sent.emplace_back(clock[w], transfer);
        } else {
          const int64_t from = a.kind == ActionKind::kRecvActivation ? a.stage - 1 : a.stage + 1;
          Edge& edge = edges[{from, a.stage}];
          if (edge.sent.empty()) break;  // not sent yet: back to this worker once it is
          const auto [sent, transfer] = edge.sent.front();
          edge.sent.pop_front();
          // Message k leaves once the sender hears that its receive is posted.
          const auto k = static_cast<int64_t>(edge.received.size());
          double leaves = sent;
          if (window > 0 && k >= window && schedule.worker_of(from) != w) {
            leaves = std::max(sent, edge.received[k - window] + costs.latency);
          }
          clock[w] = std::max(clock[w], leaves + transfer);
          edge.received.push_back(clock[w]);
        }
        prediction.begin[w][next[w]] = begin;
        prediction.end[w][next[w]] = clock[w];
      }
    }
  }
  double step_time = 0;
  double busy = 0;
  for (const auto w : c10::irange(W)) {
    step_time = std::max(step_time, clock[w]);
    busy += prediction.busy[w];
  }
  prediction.step_time = step_time;
  prediction.bubble_fraction = step_time > 0 ? 1 - busy / (static_cast<double>(W) * step_time) : 0;
  prediction.peak_live_microbatches = timeline.peak_live_microbatches;
  prediction.peak_awaiting_weight_microbatches = timeline.peak_awaiting_weight_microbatches;
  prediction.held_microbatches = timeline.held_microbatches;
  return prediction;
}

ActionCosts costs_from_trace(const std::vector<trace::Event>& events, int64_t num_stages) {
  TORCH_CHECK_VALUE(num_stages > 0, "num_stages must be positive, but got ", num_stages);
  std::map<std::string, std::vector<std::vector<double>>> durations;
  for (const char* kind : {"forward", "backward", "backward_input", "backward_weight"}) {
    durations[kind].resize(num_stages);
  }
  for (const auto& e : events) {
    auto it = durations.find(e.name);
    if (it == durations.end() || e.stage < 0 || e.stage >= num_stages) continue;
    it->second[e.stage].push_back((e.end_us - e.begin_us) * 1e-6);
  }
  ActionCosts costs;
  for (const auto s : c10::irange(num_stages)) {
    const auto cost = [&](const char* kind) {
      const auto& values = durations[kind][s];
      return values.empty() ? -1.0 : median(values);
    };
    const double forward = cost("forward");
    double backward = cost("backward");
    double input = cost("backward_input");
    double weight = cost("backward_weight");
    TORCH_CHECK_VALUE(forward >= 0, "the trace has no forward of stage ", s);
    TORCH_CHECK_VALUE(backward >= 0 || (input >= 0 && weight >= 0),
                      "the trace has no backward of stage ", s);
    if (backward < 0) backward = input + weight;
    if (input < 0 || weight < 0) input = weight = backward / 2;
    costs.forward.push_back(forward);
    costs.backward.push_back(backward);
    costs.backward_input.push_back(input);
    costs.backward_weight.push_back(weight);
  }
  return costs;
}

}  // namespace schedule
}  // namespace gpipe

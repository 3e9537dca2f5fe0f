#include "gpipe/schedule/predict.h"

#include "gpipe/schedule/validate.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
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

// The trace's compute events on `cores` shared cores: what each would have taken alone, where
// more than `cores` ran at once and each ran at cores / computing of its speed.
class SharedCores {
 public:
  SharedCores(const std::vector<trace::Event>& events, int64_t cores) {
    std::vector<std::pair<double, int>> changes;  // (time, +1 as one starts, -1 as one ends)
    for (const auto& e : events) {
      if (!trace::is_compute(e)) continue;
      changes.emplace_back(e.begin_us, 1);
      changes.emplace_back(e.end_us, -1);
    }
    std::sort(changes.begin(), changes.end());
    double alone = 0;
    int computing = 0;
    for (const auto& [time, change] : changes) {
      if (!times_.empty() && computing > 0) {
        const double rate =
            computing > cores ? static_cast<double>(cores) / static_cast<double>(computing) : 1.0;
        alone += (time - times_.back()) * rate;
      }
      times_.push_back(time);
      alone_.push_back(alone);
      computing += change;
    }
  }

  // Microseconds alone of an event of the trace.
  double alone_us(const trace::Event& e) const { return at(e.end_us) - at(e.begin_us); }

 private:
  double at(double time) const {
    const auto k = std::lower_bound(times_.begin(), times_.end(), time) - times_.begin();
    return alone_[k];
  }

  std::vector<double> times_;
  std::vector<double> alone_;  // at times_[k]: the time alone the trace has computed so far
};

}  // namespace

ActionCosts ActionCosts::unit(int64_t num_stages) {
  ActionCosts costs;
  costs.forward.assign(num_stages, 1);
  costs.backward.assign(num_stages, 2);
  costs.backward_input.assign(num_stages, 1);
  costs.backward_weight.assign(num_stages, 1);
  return costs;
}

int64_t cpu_workers_at_once(int64_t threads) {
  const auto cores = static_cast<int64_t>(std::thread::hardware_concurrency());
  return std::max<int64_t>(1, cores / std::max<int64_t>(1, threads));
}

Prediction predict(const Schedule& schedule, const ActionCosts& costs) {
  return predict(schedule, costs, simulate(schedule));  // validates; counts what stages hold
}

Prediction predict(const Schedule& schedule, const ActionCosts& costs, const Timeline& timeline) {
  TORCH_CHECK_VALUE(
      timeline.rounds.size() == schedule.actions.size() &&
          std::equal(timeline.rounds.begin(), timeline.rounds.end(), schedule.actions.begin(),
                     [](const auto& rounds, const auto& actions) {
                       return rounds.size() == actions.size();
                     }),
      "the timeline is not the schedule's: simulate(schedule) makes it");
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
  TORCH_CHECK_VALUE(costs.cores >= 0, "costs: cores must be non-negative, but is ", costs.cores);

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
  // Time moves from event to event: an action ends, a message arrives, a worker starts
  // computing or stops. Between two events the workers computing share the cores alike.
  struct Worker {
    size_t next = 0;         // its action under way or next
    bool computing = false;  // the action under way computes,
    double work = 0;         //   this much,
    double finish = 0;       //   and ends then at the present rate
    double arrival = -1;     // its receive waits for a message on its way: when it arrives
  };
  std::vector<Worker> workers(W);
  const auto cost_of = [&](const Action& a) {
    const auto& cost = a.kind == ActionKind::kForward         ? costs.forward
                       : a.kind == ActionKind::kBackward      ? costs.backward
                       : a.kind == ActionKind::kBackwardInput ? costs.backward_input
                                                              : costs.backward_weight;
    return cost[a.stage];
  };
  double now = 0;
  double rate = 1;  // of each worker computing: 1, or cores / computing where they are fewer
  std::vector<int64_t> started;  // workers that started computing at `now`
  for (;;) {
    // Each worker not computing runs its actions at `now` as far as they go; a send can let
    // another's receive go on, so round again until nothing moves.
    started.clear();
    for (bool progressed = true; progressed;) {
      progressed = false;
      for (const auto w : c10::irange(W)) {
        Worker& worker = workers[w];
        const auto& actions = schedule.actions[w];
        for (; !worker.computing && worker.next < actions.size(); progressed = true) {
          const Action& a = actions[worker.next];
          if (worker.arrival < 0) prediction.begin[w][worker.next] = now;
          if (is_compute(a.kind)) {
            worker.computing = true;
            worker.work = cost_of(a);
            started.push_back(w);
            break;
          }
          if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient) {
            const int64_t to = a.kind == ActionKind::kSendActivation ? a.stage + 1 : a.stage - 1;
            // A gradient is as large as the activation it belongs to, sent by the lower stage.
            const int64_t bytes =
                costs.message_bytes.empty() ? 0 : costs.message_bytes[std::min(a.stage, to)];
            const double transfer =
                schedule.worker_of(to) == w
                    ? 0
                    : costs.latency + static_cast<double>(bytes) * costs.seconds_per_byte;
            edges[{a.stage, to}].sent.emplace_back(now, transfer);
          } else {
            const int64_t from = a.kind == ActionKind::kRecvActivation ? a.stage - 1 : a.stage + 1;
            Edge& edge = edges[{from, a.stage}];
            if (edge.sent.empty()) {  // not sent yet: back to this worker once it is
              worker.arrival = std::numeric_limits<double>::infinity();
              break;
            }
            const auto [sent, transfer] = edge.sent.front();
            // Message k leaves once the sender hears that its receive is posted.
            const auto k = static_cast<int64_t>(edge.received.size());
            double leaves = sent;
            if (window > 0 && k >= window && schedule.worker_of(from) != w) {
              leaves = std::max(sent, edge.received[k - window] + costs.latency);
            }
            worker.arrival = leaves + transfer;
            if (worker.arrival > now) break;  // on its way
            edge.sent.pop_front();
            edge.received.push_back(now);
            worker.arrival = -1;
          }
          prediction.end[w][worker.next++] = now;
        }
      }
    }
    // The rate for the workers computing from now on; those under way keep the work left.
    int64_t computing = 0;
    for (const auto& worker : workers) computing += worker.computing;
    const double cores = costs.cores > 0 ? static_cast<double>(costs.cores) : computing;
    const double new_rate = computing > cores ? cores / static_cast<double>(computing) : 1.0;
    if (new_rate != rate) {
      for (auto& worker : workers) {
        if (worker.computing) worker.finish = now + (worker.finish - now) * rate / new_rate;
      }
      rate = new_rate;
    }
    for (const int64_t w : started) workers[w].finish = now + workers[w].work / rate;
    // On to the next event: an action that ends, or a message that arrives.
    double next_event = std::numeric_limits<double>::infinity();
    for (const auto& worker : workers) {
      next_event = std::min(next_event, worker.computing      ? worker.finish
                                        : worker.arrival >= 0 ? worker.arrival
                                                              : next_event);
    }
    if (next_event == std::numeric_limits<double>::infinity()) break;  // all done
    now = next_event;
    for (const auto w : c10::irange(W)) {
      Worker& worker = workers[w];
      if (worker.computing && worker.finish <= now) {
        worker.computing = false;
        prediction.busy[w] += worker.work;
        prediction.end[w][worker.next++] = now;
      }
    }
  }
  double step_time = 0;
  double busy = 0;
  for (const auto w : c10::irange(W)) {
    if (!schedule.actions[w].empty()) step_time = std::max(step_time, prediction.end[w].back());
    busy += prediction.busy[w];
  }
  prediction.step_time = step_time;
  const double capacity = static_cast<double>(costs.cores > 0 ? std::min(W, costs.cores) : W);
  prediction.bubble_fraction = step_time > 0 ? 1 - busy / (capacity * step_time) : 0;
  prediction.peak_live_microbatches = timeline.peak_live_microbatches;
  prediction.peak_awaiting_weight_microbatches = timeline.peak_awaiting_weight_microbatches;
  prediction.held_microbatches = timeline.held_microbatches;
  return prediction;
}

ActionCosts costs_from_trace(const std::vector<trace::Event>& events, int64_t num_stages,
                             int64_t cores) {
  TORCH_CHECK_VALUE(num_stages > 0, "num_stages must be positive, but got ", num_stages);
  TORCH_CHECK_VALUE(cores >= 0, "cores must be non-negative, but got ", cores);
  std::optional<SharedCores> shared;
  if (cores > 0) shared.emplace(events, cores);
  std::map<std::string, std::vector<std::vector<double>>> durations;
  for (const char* kind : {"forward", "backward", "backward_input", "backward_weight"}) {
    durations[kind].resize(num_stages);
  }
  for (const auto& e : events) {
    auto it = durations.find(e.name);
    if (it == durations.end() || e.stage < 0 || e.stage >= num_stages) continue;
    it->second[e.stage].push_back((shared ? shared->alone_us(e) : e.end_us - e.begin_us) * 1e-6);
  }
  ActionCosts costs;
  costs.cores = cores;
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

#include "gpipe/schedule/validate.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>

namespace gpipe {
namespace schedule {
namespace {

struct Message {
  int64_t microbatch;
  int64_t arrival;  // the first round in which it can be received
  int64_t taken;    // messages its stage had received on the edge back (c10d_transport.h)
};

// Where the simulation of one schedule stands.
class Simulation {
 public:
  Simulation(const Schedule& schedule, const ValidateOptions& options)
      : schedule_(schedule),
        capacity_(options.queue_capacity()),
        worker_names_(options.worker_names()),
        forward_only_(options.forward_only()),
        S_(schedule.num_stages),
        M_(schedule.num_microbatches),
        forwarded_(S_ * M_, false),
        backwarded_(S_ * M_, false),
        weighted_(S_ * M_, false),
        activation_received_(S_ * M_, false),
        gradient_received_(S_ * M_, false),
        activation_sent_(S_ * M_, false),
        gradient_sent_(S_ * M_, false),
        live_(S_, 0),
        peak_live_(S_, 0),
        awaiting_(S_, 0),
        peak_awaiting_(S_, 0),
        upstream_(S_, 0),
        downstream_(S_, 0),
        sent_upstream_(S_, 0),
        unreturned_(S_, 0),
        forwards_left_(S_, M_),
        backwards_left_(S_, M_),
        activations_taken_(S_, 0),
        gradients_taken_(S_, 0),
        activations_acked_(S_, 0),
        gradients_acked_(S_, 0),
        stages_of_(schedule.num_workers),
        held_(schedule.num_workers) {
    for (const auto s : c10::irange(S_)) {
      const int64_t w = schedule.worker_of(s);
      if (w >= 0 && w < schedule.num_workers) stages_of_[w].push_back(s);
    }
    for (const auto& actions : schedule.actions) {
      for (const Action& a : actions) {
        split_ =
            split_ || a.kind == ActionKind::kBackwardInput || a.kind == ActionKind::kBackwardWeight;
      }
    }
  }

  Timeline run();

 private:
  enum class Step { kRan, kWait };

  // Runs actions[w][pc] in `round` if it can run; throws if it is invalid.
  Step step(int64_t w, int64_t pc, int64_t round);
  void check_static(int64_t w, int64_t pc, const Action& a) const;
  std::string where(int64_t w, int64_t pc) const;
  std::string worker(int64_t w) const;
  // Records what worker w's stages hold now, as stage `stage` starts `starting`.
  void hold(int64_t w, int64_t stage = -1,
            HeldMicrobatches::Starting starting = HeldMicrobatches::Starting::kNothing) {
    std::vector<HeldMicrobatches> moment;
    for (const int64_t s : stages_of_[w]) {
      moment.push_back({live_[s], awaiting_[s],
                        s == stage ? starting : HeldMicrobatches::Starting::kNothing, upstream_[s],
                        downstream_[s], sent_upstream_[s], unreturned_[s], forwards_left_[s],
                        backwards_left_[s]});
    }
    held_[w].insert(std::move(moment));
  }
  // Micro-batch i is through stage s's weight gradient: its graph there is freed, but its output
  // stays while the next stage holds it, and the output of the stage before, held here, goes.
  void weighted(int64_t s, int64_t i) {
    weighted_[index(s, i)] = true;
    if (s + 1 < S_ && !weighted_[index(s + 1, i)]) ++downstream_[s];
    if (s > 0 && weighted_[index(s - 1, i)]) --downstream_[s - 1];
  }
  // Throws that `action` never happens, naming the worker of its stage.
  [[noreturn]] void never_runs(const Action& action) const;
  size_t index(int64_t stage, int64_t microbatch) const { return stage * M_ + microbatch; }
  std::deque<Message>& queue(int64_t from, int64_t to) { return queues_[{from, to}]; }

  const Schedule& schedule_;
  const int64_t capacity_;
  const std::vector<std::string> worker_names_;
  const bool forward_only_;
  const int64_t S_;
  const int64_t M_;
  // backwarded_: the input gradient is computed (Backward or BackwardInput); weighted_: the
  // weight gradient too (Backward or BackwardWeight), which frees the micro-batch's graph.
  std::vector<bool> forwarded_, backwarded_, weighted_, activation_received_, gradient_received_,
      activation_sent_, gradient_sent_;
  // Per stage: micro-batches forwarded and not yet weighted, now and at most; of them, those
  // past their BackwardInput, now and at most.
  std::vector<int64_t> live_, peak_live_, awaiting_, peak_awaiting_;
  // Per stage: what HeldMicrobatches::upstream, downstream, sent_upstream, unreturned,
  // forwards_left and backwards_left count, now.
  std::vector<int64_t> upstream_, downstream_, sent_upstream_, unreturned_, forwards_left_,
      backwards_left_;
  // Per stage: activations and gradients it received, and of the gradients and activations it
  // sent back, those a message it received said came.
  std::vector<int64_t> activations_taken_, gradients_taken_, activations_acked_, gradients_acked_;
  // Per worker: its stages, in increasing order; what they held as each compute action of one
  // started, and after each Forward and BackwardInput of one.
  std::vector<std::vector<int64_t>> stages_of_;
  std::vector<std::set<std::vector<HeldMicrobatches>>> held_;
  bool split_ = false;  // the schedule splits backwards
  std::map<std::pair<int64_t, int64_t>, std::deque<Message>> queues_;
};

std::string Simulation::worker(int64_t w) const {
  if (w >= 0 && w < static_cast<int64_t>(worker_names_.size())) return worker_names_[w];
  return "worker " + std::to_string(w);
}

std::string Simulation::where(int64_t w, int64_t pc) const {
  std::ostringstream out;
  out << "invalid schedule: " << worker(w) << ", action " << pc << ", " << schedule_.actions[w][pc]
      << ": ";
  return out.str();
}

void Simulation::never_runs(const Action& action) const {
  TORCH_CHECK_VALUE(false, "invalid schedule: it never runs ", action, " (a stage of ",
                    worker(schedule_.worker_of(action.stage)), ")");
}

void Simulation::check_static(int64_t w, int64_t pc, const Action& a) const {
  TORCH_CHECK_VALUE(a.stage >= 0 && a.stage < S_, where(w, pc), "stage ", a.stage,
                    " is out of range for ", S_, " stages");
  TORCH_CHECK_VALUE(a.microbatch >= 0 && a.microbatch < M_, where(w, pc), "micro-batch ",
                    a.microbatch, " is out of range for ", M_, " micro-batches");
  TORCH_CHECK_VALUE(schedule_.worker_of(a.stage) == w, where(w, pc), "stage ", a.stage, " runs on ",
                    worker(schedule_.worker_of(a.stage)), ", not on ", worker(w));
}

Simulation::Step Simulation::step(int64_t w, int64_t pc, int64_t round) {
  const Action& a = schedule_.actions[w][pc];
  check_static(w, pc, a);
  const int64_t s = a.stage;
  const int64_t i = a.microbatch;
  const size_t k = index(s, i);
  TORCH_CHECK_VALUE(!forward_only_ || a.kind == ActionKind::kForward ||
                        a.kind == ActionKind::kSendActivation ||
                        a.kind == ActionKind::kRecvActivation,
                    where(w, pc), "a forward-only schedule has no backwards or gradients");
  switch (a.kind) {
    case ActionKind::kForward:
      TORCH_CHECK_VALUE(!forwarded_[k], where(w, pc), "micro-batch ", i,
                        " was already forwarded on stage ", s);
      TORCH_CHECK_VALUE(s == 0 || activation_received_[k], where(w, pc),
                        "uses the activation of micro-batch ", i,
                        " before it arrives (no RecvActivation of it before)");
      forwarded_[k] = true;
      --forwards_left_[s];
      if (!forward_only_) {
        hold(w, s, HeldMicrobatches::Starting::kForward);
        peak_live_[s] = std::max(peak_live_[s], ++live_[s]);
        if (s + 1 < S_) ++unreturned_[s];
        hold(w);
      }
      return Step::kRan;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      TORCH_CHECK_VALUE(!backwarded_[k], where(w, pc), "micro-batch ", i,
                        " was already backwarded on stage ", s);
      TORCH_CHECK_VALUE(forwarded_[k], where(w, pc), "runs before the forward of micro-batch ", i,
                        " on stage ", s);
      TORCH_CHECK_VALUE(s == S_ - 1 || gradient_received_[k], where(w, pc),
                        "uses the gradient of micro-batch ", i,
                        " before it arrives (no RecvGradient of it before)");
      backwarded_[k] = true;
      --backwards_left_[s];
      hold(w, s,
           a.kind == ActionKind::kBackward ? HeldMicrobatches::Starting::kBackward
                                           : HeldMicrobatches::Starting::kBackwardInput);
      if (s > 0) {
        ++upstream_[s];
        ++sent_upstream_[s];
      }
      // The gradient from the next stage is used, but by the first stage's weight half.
      if (s + 1 < S_ && (a.kind == ActionKind::kBackward || s > 0)) --upstream_[s + 1];
      if (a.kind == ActionKind::kBackward) {
        weighted(s, i);
        --live_[s];
      } else {
        peak_awaiting_[s] = std::max(peak_awaiting_[s], ++awaiting_[s]);
        hold(w);
      }
      return Step::kRan;
    case ActionKind::kBackwardWeight:
      TORCH_CHECK_VALUE(!weighted_[k], where(w, pc), "micro-batch ", i,
                        " already has its weight gradient on stage ", s);
      TORCH_CHECK_VALUE(backwarded_[k], where(w, pc),
                        "runs before the BackwardInput of micro-batch ", i, " on stage ", s);
      hold(w, s, HeldMicrobatches::Starting::kBackwardWeight);
      weighted(s, i);
      if (s == 0 && S_ > 1) --upstream_[1];
      --live_[s];
      --awaiting_[s];
      return Step::kRan;
    case ActionKind::kSendActivation:
    case ActionKind::kSendGradient: {
      const bool activation = a.kind == ActionKind::kSendActivation;
      const int64_t to = activation ? s + 1 : s - 1;
      TORCH_CHECK_VALUE(to >= 0 && to < S_, where(w, pc), "stage ", s, " has no ",
                        activation ? "next" : "previous", " stage to send to");
      auto& sent = activation ? activation_sent_ : gradient_sent_;
      TORCH_CHECK_VALUE(!sent[k], where(w, pc), "micro-batch ", i, " was already sent");
      TORCH_CHECK_VALUE(activation ? forwarded_[k] : backwarded_[k], where(w, pc), "sends the ",
                        activation ? "activation" : "gradient", " of micro-batch ", i,
                        " before it is computed (no ",
                        activation ? "Forward" : "Backward or BackwardInput", " of it before)");
      auto& q = queue(s, to);
      if (capacity_ > 0 && static_cast<int64_t>(q.size()) >= capacity_) return Step::kWait;
      q.push_back({i, round + 1, activation ? gradients_taken_[s] : activations_taken_[s]});
      sent[k] = true;
      return Step::kRan;
    }
    case ActionKind::kRecvActivation:
    case ActionKind::kRecvGradient: {
      const bool activation = a.kind == ActionKind::kRecvActivation;
      const int64_t from = activation ? s - 1 : s + 1;
      TORCH_CHECK_VALUE(from >= 0 && from < S_, where(w, pc), "stage ", s, " has no ",
                        activation ? "previous" : "next", " stage to receive from");
      auto& received = activation ? activation_received_ : gradient_received_;
      TORCH_CHECK_VALUE(!received[k], where(w, pc), "micro-batch ", i, " was already received");
      auto& q = queue(from, s);
      if (q.empty() || q.front().arrival > round) return Step::kWait;
      TORCH_CHECK_VALUE(q.front().microbatch == i, where(w, pc), "the next ",
                        activation ? "activation" : "gradient", " from stage ", from,
                        " is of micro-batch ", q.front().microbatch, ", not ", i,
                        " (messages on an edge arrive in the order they were sent)");
      // What this stage sent back that the message says came is let go. The counts an edge's
      // messages carry never fall: they arrive in order, each counted when it was sent.
      int64_t& acked = activation ? gradients_acked_[s] : activations_acked_[s];
      (activation ? sent_upstream_ : unreturned_)[s] -= q.front().taken - acked;
      acked = q.front().taken;
      ++(activation ? activations_taken_ : gradients_taken_)[s];
      q.pop_front();
      received[k] = true;
      return Step::kRan;
    }
  }
  TORCH_CHECK_VALUE(false, where(w, pc), "unknown action kind ", static_cast<int>(a.kind));
}

Timeline Simulation::run() {
  const int64_t W = schedule_.num_workers;
  Timeline timeline;
  timeline.rounds.resize(W);
  std::vector<int64_t> pc(W, 0);
  for (const auto w : c10::irange(W)) timeline.rounds[w].resize(schedule_.actions[w].size());
  for (int64_t round = 0;; ++round) {
    bool progressed = false;
    bool finished = true;
    for (const auto w : c10::irange(W)) {
      const auto& actions = schedule_.actions[w];
      bool computed = false;
      while (pc[w] < static_cast<int64_t>(actions.size())) {
        const bool compute = is_compute(actions[pc[w]].kind);
        if (compute && computed) break;
        if (step(w, pc[w], round) == Step::kWait) break;
        timeline.rounds[w][pc[w]++] = round;
        computed = computed || compute;
        progressed = true;
      }
      finished = finished && pc[w] == static_cast<int64_t>(actions.size());
    }
    if (finished) {
      timeline.num_rounds = round + 1;
      timeline.peak_live_microbatches = peak_live_;
      timeline.peak_awaiting_weight_microbatches = peak_awaiting_;
      for (const auto& moments : held_) {
        timeline.held_microbatches.emplace_back(moments.begin(), moments.end());
      }
      break;
    }
    if (!progressed) {
      std::ostringstream waits;
      for (const auto w : c10::irange(W)) {
        if (pc[w] == static_cast<int64_t>(schedule_.actions[w].size())) continue;
        waits << (waits.tellp() > 0 ? "; " : "") << worker(w) << " waits at action " << pc[w]
              << ", " << schedule_.actions[w][pc[w]];
      }
      TORCH_CHECK_VALUE(false, "invalid schedule: deadlock: ", waits.str());
    }
  }
  for (const auto s : c10::irange(S_)) {
    for (const auto i : c10::irange(M_)) {
      const size_t k = index(s, i);
      if (!forwarded_[k]) never_runs({ActionKind::kForward, i, s});
      if (forward_only_) continue;
      if (!backwarded_[k]) {
        never_runs({split_ ? ActionKind::kBackwardInput : ActionKind::kBackward, i, s});
      }
      if (!weighted_[k]) never_runs({ActionKind::kBackwardWeight, i, s});
    }
  }
  for (const auto& entry : queues_) {
    if (entry.second.empty()) continue;
    const bool activation = entry.first.second > entry.first.first;
    const Action send{activation ? ActionKind::kSendActivation : ActionKind::kSendGradient,
                      entry.second.front().microbatch, entry.first.first};
    TORCH_CHECK_VALUE(false, "invalid schedule: ", send, " (",
                      worker(schedule_.worker_of(send.stage)), ") is never received by stage ",
                      entry.first.second);
  }
  return timeline;
}

}  // namespace

Timeline simulate(const Schedule& schedule, const ValidateOptions& options) {
  TORCH_CHECK_VALUE(schedule.num_workers > 0,
                    "invalid schedule: num_workers must be positive, but is ",
                    schedule.num_workers);
  TORCH_CHECK_VALUE(schedule.num_microbatches > 0,
                    "invalid schedule: num_microbatches must be positive, but is ",
                    schedule.num_microbatches);
  TORCH_CHECK_VALUE(schedule.num_stages > 0 && schedule.num_stages % schedule.num_workers == 0,
                    "invalid schedule: num_stages must be a positive multiple of num_workers (",
                    schedule.num_workers, "), but is ", schedule.num_stages);
  TORCH_CHECK_VALUE(static_cast<int64_t>(schedule.actions.size()) == schedule.num_workers,
                    "invalid schedule: it has action lists for ", schedule.actions.size(),
                    " workers, but num_workers is ", schedule.num_workers);
  TORCH_CHECK_VALUE(options.queue_capacity() >= 0, "queue_capacity must be non-negative, but got ",
                    options.queue_capacity());
  return Simulation(schedule, options).run();
}

void validate(const Schedule& schedule, const ValidateOptions& options) {
  simulate(schedule, options);
}

}  // namespace schedule
}  // namespace gpipe

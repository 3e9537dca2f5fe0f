// How much of a network's latency each schedule hides: `gpipe train` on 2 ranks, one in each of
// two network namespaces joined by a link with a one-way delay (a DelayedLink); the step time
// each ms of delay adds, next to what predict() (gpipe/schedule/predict.h) expects of the same
// schedule with equal stages and messages that arrive `delay` after their send. A schedule that
// waited for every message on its critical path in full would add 2 ms per ms and round trip of
// messages on that path; what it adds less, it hides behind computation.
//
// Phases, not runs: within one run the link switches between no delay and the delay every
// kPhase; the delayed phases' median step is compared with the undelayed phases', and each
// delayed phase with the two around it shows how much phases swing. Runs apart, this machine's
// speed drifts by more than the delay adds.
// Rank 0's trace gives the steps; its steady_clock_origin_us places them among the switches.
//
// Why TAP devices and not `tc qdisc add dev <veth> root netem delay 1ms`: netem is a kernel
// module (sch_netem) that this project's machine does not have; a user-space link needs only
// /dev/net/tun. Needs root (or CAP_NET_ADMIN) and iproute2; prints "skipped: <why>" and exits 0
// where it cannot make the link.
//
// Default: gpipe train's own model and data, batch 32 in 4 micro-batches, 150 steps a run
// (--steps), schedules gpipe, 1f1b and zb1p (--schedules; those that loop stages or place them
// in a V get 2 per rank), a delay of 5 ms (--delays 1,5: each),
// --rounds N. $GPIPE_TRAIN_FLAGS is added to gpipe train's flags, e.g. "--receive-window 1"
// (predict() still assumes the automatic window).
//
// TCP congestion control on the link is cubic, Linux's default (--congestion). Where the
// machine's own is BBR (as this project's is), its pacing would be part of every number: BBR
// sends each burst at its estimate of the bandwidth, which a pipeline's bursts, separated by
// computation, keep low, so a message takes milliseconds longer to arrive than the delay.
#include "common/bench_util.h"
#include "link-delay/delayed_link.h"

#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/predict.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpipe::bench;
namespace gs = gpipe::schedule;

constexpr int kBatch = 32, kChunks = 4;
// How long the link keeps each delay within a run: about 10 steps of the default model here.
constexpr auto kPhase = std::chrono::milliseconds(1200);
// Steps of a run's start left out: the first steps learn the messages' sizes and warm up.
constexpr size_t kWarmupSteps = 2;

// Set by SIGINT or SIGTERM: the benchmark stops after the run in progress and removes the link.
std::atomic<bool> interrupted{false};

// Runs gpipe train as rank h of 2 on host h of the link, and returns rank 0's samples/s; 0, with
// both ranks' output in `error`, where a rank fails.
double train(const DelayedLink& link, const std::string& flags, int port, std::string* error) {
  std::string outputs[2];
  int codes[2] = {-1, -1};
  std::vector<std::thread> ranks;
  for (int h = 0; h < 2; ++h) {
    const std::string rank = std::to_string(h);
    const std::string command =
        "ip netns exec " + link.host(h) + " env RANK=" + rank +
        " WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=" + rank +
        " MASTER_ADDR=" + link.address(0) + " MASTER_PORT=" + std::to_string(port) +
        " GLOO_SOCKET_IFNAME=" + link.interface(h) + " " + GPIPE_COMMAND + flags;
    ranks.emplace_back([&, h, command] { codes[h] = run_command(command, &outputs[h]); });
  }
  for (auto& rank : ranks) rank.join();
  std::smatch match;
  if (codes[0] != 0 || codes[1] != 0 ||
      !std::regex_search(outputs[0], match, std::regex(R"(, ([0-9.]+) samples/s \()"))) {
    *error = "gpipe" + flags + " on 2 ranks failed (exit " + std::to_string(codes[0]) + ", " +
             std::to_string(codes[1]) + "):\nrank 0:\n" + outputs[0] + "\nrank 1:\n" + outputs[1];
    return 0;
  }
  return std::stod(match[1]);
}

// What predict() expects each ms of one-way delay to add to a step of `schedule`, in ms: equal
// stages, forward 1 and backward 2 (each half 1) scaled to the measured step without delay, and
// the receive window gpipe train's ranks use (PipelineStageOptions::receive_window's automatic
// one: the most micro-batches a stage holds at once).
double predicted_slope(const std::string& schedule, double step_ms, double delay_ms) {
  const int64_t stages = 2 * stages_per_rank(schedule);
  const auto plan = gs::make_schedule(gs::parse_schedule_kind(schedule), 2, stages, kChunks);
  gs::ActionCosts costs = gs::ActionCosts::unit(stages);
  const auto live = gs::predict(plan, costs).peak_live_microbatches;
  costs.receive_window = *std::max_element(live.begin(), live.end());
  const double unit_step = gs::predict(plan, costs).step_time;
  const double ms_per_unit = step_ms / unit_step;
  costs.latency = delay_ms / ms_per_unit;
  return (gs::predict(plan, costs).step_time - unit_step) * ms_per_unit / delay_ms;
}

// One run's steps, by the link's delay while each ran.
struct PhasedRun {
  std::vector<double> undelayed_ms, delayed_ms;  // the steps wholly inside a phase
  // Per delayed phase with an undelayed phase on each side: its median step less theirs, per
  // ms of delay.
  std::vector<double> slopes;
  std::vector<double> switches_us;  // when each phase began (steady clock); odd ones delayed
};

// Rank 0's steps in the trace at `path`: when each began (its stage 0's first forward) on this
// machine's steady clock, in us; empty, with `error` set, where the trace cannot be read.
std::vector<double> step_starts_us(const std::string& path, std::string* error) {
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (trace.is_discarded() || !trace.contains("otherData")) {
    *error = "no trace with its origin at " + path;
    return {};
  }
  const double origin_us = trace["otherData"]["steady_clock_origin_us"].get<double>();
  std::vector<double> starts;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "X" && e.value("pid", -1) == 0 && e.value("name", "") == "forward" &&
        e["args"].value("stage", -1) == 0 && e["args"].value("microbatch", -1) == 0) {
      starts.push_back(origin_us + e["ts"].get<double>());
    }
  }
  std::sort(starts.begin(), starts.end());
  return starts;
}

// Runs gpipe train with `flags` while the link switches between no delay and `delay` every
// kPhase, beginning without; sorts its steps by phase. A step counts for a phase if it began at
// least the delay (and 1 ms) after the phase began, when frames queued before the switch have
// left, and ended before the next. Empty, with `error` set, where a rank or the trace fails.
PhasedRun phased_run(DelayedLink& link, const std::string& flags, int port,
                     std::chrono::milliseconds delay, const std::string& trace,
                     std::string* error) {
  using Clock = std::chrono::steady_clock;
  const auto us = [](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
  };
  std::vector<double> switches_us;  // when each phase began; odd phases are delayed
  std::mutex mutex;
  std::condition_variable stop;
  bool stopped = false;
  link.set_delay(std::chrono::microseconds(0));
  switches_us.push_back(us(Clock::now()));
  std::thread switcher([&] {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop.wait_for(lock, kPhase, [&] { return stopped; })) {
      const bool delayed = switches_us.size() % 2 == 1;
      link.set_delay(delayed ? std::chrono::microseconds(delay) : std::chrono::microseconds(0));
      switches_us.push_back(us(Clock::now()));
    }
  });
  const double throughput = train(link, flags + " --trace " + trace, port, error);
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopped = true;
  }
  stop.notify_all();
  switcher.join();
  link.set_delay(std::chrono::microseconds(0));
  PhasedRun run;
  run.switches_us = switches_us;
  if (throughput == 0) return run;
  const std::vector<double> starts = step_starts_us(trace, error);
  const double settle_us = 1000.0 * (delay.count() + 1);
  std::vector<std::vector<double>> by_phase(switches_us.size());
  for (size_t k = kWarmupSteps; k + 1 < starts.size(); ++k) {
    const auto next = std::upper_bound(switches_us.begin(), switches_us.end(), starts[k]);
    const size_t phase = static_cast<size_t>(next - switches_us.begin()) - 1;
    if (starts[k] < switches_us[phase] + settle_us) continue;
    if (next != switches_us.end() && starts[k + 1] > *next) continue;
    by_phase[phase].push_back((starts[k + 1] - starts[k]) / 1000);
    (phase % 2 ? run.delayed_ms : run.undelayed_ms).push_back(by_phase[phase].back());
  }
  for (size_t p = 1; p + 1 < by_phase.size(); p += 2) {
    if (by_phase[p - 1].size() < 2 || by_phase[p].size() < 2 || by_phase[p + 1].size() < 2) {
      continue;
    }
    const double around = (median(by_phase[p - 1]) + median(by_phase[p + 1])) / 2;
    run.slopes.push_back((median(by_phase[p]) - around) / static_cast<double>(delay.count()));
  }
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  std::string delays_flag = "5", schedules_flag = "gpipe,1f1b,zb1p", steps_flag = "150",
              congestion_flag = "cubic", traces_flag;
  const Args args = parse_args(
      argc, argv, "link_delay",
      "gpipe train on 2 ranks in two network namespaces joined by a link (user-space "
      "TAP forwarding, not netem) that switches between no delay and a one-way delay "
      "within each run: the step time each ms of delay adds, per schedule.",
      /*default_rounds=*/3,
      {{"--delays", &delays_flag, "one-way delays in ms, comma-separated, each in runs of its own"},
       {"--schedules", &schedules_flag, "the schedules, comma-separated"},
       {"--steps", &steps_flag, "gpipe train's steps per run"},
       {"--congestion", &congestion_flag,
        "TCP congestion control on the link: cubic (Linux's default), bbr, reno; "
        "'machine': this machine's own"},
       {"--traces", &traces_flag,
        "a folder to keep each run's trace in (<schedule>_<delay>ms_<round>.json) and when its "
        "phases began (.json.switches, steady clock in us; odd phases delayed)"}});
  std::vector<int> delays_ms;
  for (const auto& delay : split_list(delays_flag)) delays_ms.push_back(std::atoi(delay.c_str()));
  if (delays_ms.empty() || *std::min_element(delays_ms.begin(), delays_ms.end()) <= 0) {
    std::fprintf(stderr, "link_delay: --delays %s: give delays above 0 ms\n", delays_flag.c_str());
    return 2;
  }
  // Made here: gpipe train refuses a trace into a missing folder on rank 0 only, and rank 1
  // would wait out its rendezvous timeout for it.
  std::error_code made;
  if (!traces_flag.empty() && !std::filesystem::create_directories(traces_flag, made) && made) {
    std::fprintf(stderr, "link_delay: --traces %s: %s\n", traces_flag.c_str(),
                 made.message().c_str());
    return 2;
  }
  const std::vector<std::string> schedules = split_list(schedules_flag);
  DelayedLink link;
  if (!link.failure().empty()) {
    std::printf("skipped: %s\n", link.failure().c_str());
    return 0;
  }
  std::string error;
  if (congestion_flag != "machine" && !link.set_congestion_control(congestion_flag, &error)) {
    std::fprintf(stderr, "link_delay: --congestion %s: %s\n", congestion_flag.c_str(),
                 error.c_str());
    return 2;
  }
  const std::string congestion = link.congestion_control();
  std::printf("TCP congestion control on the link: %s; phases of %lld ms\n", congestion.c_str(),
              static_cast<long long>(kPhase.count()));
  for (int sig : {SIGINT, SIGTERM}) signal(sig, [](int) { interrupted = true; });
  char folder[] = "/tmp/gpipe_link_delay_XXXXXX";
  if (mkdtemp(folder) == nullptr) {
    std::perror("link_delay: mkdtemp");
    return 1;
  }
  const auto trace_of = [&](const std::string& schedule, int delay, int round) {
    return traces_flag.empty() ? std::string(folder) + "/trace.json"
                               : traces_flag + "/" + schedule + "_" + std::to_string(delay) +
                                     "ms_" + std::to_string(round + 1) + ".json";
  };

  const char* extra = std::getenv("GPIPE_TRAIN_FLAGS");
  const std::string flags = " train --batch-size " + std::to_string(kBatch) + " --chunks " +
                            std::to_string(kChunks) + " --steps " + steps_flag +
                            (extra ? " " + std::string(extra) : "");
  std::map<int, std::vector<double>> round_trips;         // by delay
  std::map<std::pair<std::string, int>, PhasedRun> runs;  // by schedule and delay, all rounds
  int port = 29500;
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < args.rounds; ++round) {
    // Every other round in the opposite order, so that a drift of the machine's speed falls on
    // all contenders alike.
    auto delays = delays_ms;
    auto order = schedules;
    if (round % 2) {
      std::reverse(delays.begin(), delays.end());
      std::reverse(order.begin(), order.end());
    }
    for (int delay : delays) {
      link.set_delay(std::chrono::milliseconds(delay));
      const double round_trip = link.round_trip_ms(20, &error);
      if (round_trip < 0) {
        std::fprintf(stderr, "link_delay: cannot measure the round trip: %s\n", error.c_str());
        return 1;
      }
      round_trips[delay].push_back(round_trip);
      for (const auto& schedule : order) {
        const PhasedRun run = phased_run(
            link,
            flags + " --schedule " + schedule + " --stages " +
                std::to_string(2 * stages_per_rank(schedule)) + " --virtual-stages " +
                std::to_string(stages_per_rank(schedule)),
            port++, std::chrono::milliseconds(delay), trace_of(schedule, delay, round), &error);
        if (run.undelayed_ms.empty() || interrupted) {
          std::fprintf(stderr, "link_delay: %s\n", interrupted ? "interrupted" : error.c_str());
          return 1;
        }
        if (!traces_flag.empty()) {
          std::ofstream(trace_of(schedule, delay, round) + ".switches")
              << nlohmann::json(run.switches_us).dump() << "\n";
        }
        PhasedRun& all = runs[{schedule, delay}];
        for (auto [from, to] : {std::pair{&run.undelayed_ms, &all.undelayed_ms},
                                {&run.delayed_ms, &all.delayed_ms},
                                {&run.slopes, &all.slopes}}) {
          to->insert(to->end(), from->begin(), from->end());
        }
        std::printf(
            "round %d, %s, %d ms: steps %.1f ms without delay, %.1f ms with; %zu phase "
            "pairs, median %.2f ms per ms\n",
            round + 1, schedule.c_str(), delay, median(run.undelayed_ms), median(run.delayed_ms),
            run.slopes.size(), median(run.slopes));
        std::fflush(stdout);
      }
    }
  }
  std::remove((std::string(folder) + "/trace.json").c_str());
  rmdir(folder);
  std::printf("\n");

  Table table({"2 ranks, one-way delay", "round trip (ms)", "step without (ms)", "step with (ms)",
               "+step ms per delay ms", "phase pairs: n, min / median / max", "predict(): per ms"});
  nlohmann::json report = {{"flags", flags},
                           {"congestion_control", congestion},
                           {"phase_ms", kPhase.count()},
                           {"rounds", args.rounds},
                           {"delays_ms", delays_ms},
                           {"frames_forwarded", link.forwarded()},
                           {"frames_dropped", link.dropped()},
                           {"seconds", seconds_since(start)}};
  for (const auto& schedule : schedules) {
    for (int delay : delays_ms) {
      const PhasedRun& run = runs[{schedule, delay}];
      const double base_step = median(run.undelayed_ms);
      const double predicted = predicted_slope(schedule, base_step, delay);
      const std::string spread =
          min_median_max(run.slopes, [](double slope) { return fixed(slope, 2); });
      // The headline: the median step of every delayed phase against that of every undelayed
      // one, phases of the same runs taking turns; the pairs show how much single phases swing.
      const double slope = (median(run.delayed_ms) - base_step) / delay;
      table.add({schedule + ", " + std::to_string(delay) + " ms",
                 fixed(median(round_trips[delay]), 2), fixed(base_step, 1),
                 fixed(median(run.delayed_ms), 1), fixed(slope, 2),
                 std::to_string(run.slopes.size()) + ", " + spread, fixed(predicted, 2)});
      report[schedule][std::to_string(delay) + "ms"] = {
          {"round_trip_ms", median(round_trips[delay])},
          {"undelayed_steps_ms", run.undelayed_ms},
          {"delayed_steps_ms", run.delayed_ms},
          {"step_ms_per_delay_ms_per_phase_pair", run.slopes},
          {"step_ms_per_delay_ms", slope},
          {"predicted_step_ms_per_delay_ms", predicted}};
    }
  }
  table.print();
  std::printf(
      "\n(a schedule that hid nothing would add 2 for each message round trip on its critical "
      "path; predict(): that count where messages are the only wait)\n"
      "link: %llu frames forwarded, %llu dropped; %.0f s\n",
      static_cast<unsigned long long>(link.forwarded()),
      static_cast<unsigned long long>(link.dropped()), seconds_since(start));
  write_json(args, report);
  return 0;
}

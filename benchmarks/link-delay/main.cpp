// How much of a network's latency each schedule hides: `gpipe train` on 2 ranks, one in each of
// two network namespaces joined by a link with a one-way delay of 0, 1 and 5 ms (a DelayedLink),
// round by round; throughput (samples/s from rank 0's summary line, which leaves out start-up),
// the link's measured round trip, and the step time each ms of one-way delay adds. A schedule
// that waited for every message on its critical path in full would add 2 ms per ms and round
// trip of messages on that path; what it adds less, it hides behind computation. Next to it,
// what predict() (gpipe/schedule/predict.h) expects of the same schedule with equal stages and
// messages that arrive `delay` after their send.
//
// Why TAP devices and not `tc qdisc add dev <veth> root netem delay 1ms`: netem is a kernel
// module (sch_netem) that this project's machine does not have; a user-space link needs only
// /dev/net/tun. Needs root (or CAP_NET_ADMIN) and iproute2; prints "skipped: <why>" and exits 0
// where it cannot make the link.
//
// Default: gpipe train's own model and data, batch 32 in 4 micro-batches, 30 steps (--steps),
// schedules gpipe, 1f1b and zb1p (--schedules), delays 0, 1 and 5 ms (--delays), --rounds N.
// $GPIPE_TRAIN_FLAGS is added to gpipe train's flags, e.g. "--receive-window 1" (predict() still
// assumes the automatic window).
//
// TCP congestion control on the link is cubic, Linux's default (--congestion). Where the machine's
// own is BBR (as this project's is), its pacing would be part of every number: BBR sends each
// burst at its estimate of the bandwidth, which a pipeline's bursts, separated by computation,
// keep low, so a message takes milliseconds longer to arrive than the delay.
#include "common/bench_util.h"
#include "link-delay/delayed_link.h"

#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/predict.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace gpipe::bench;
namespace gs = gpipe::schedule;

constexpr int kBatch = 32, kChunks = 4;

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
  const auto plan = gs::make_schedule(gs::parse_schedule_kind(schedule), 2, 2, kChunks);
  gs::ActionCosts costs = gs::ActionCosts::unit(2);
  const auto live = gs::predict(plan, costs).peak_live_microbatches;
  costs.receive_window = *std::max_element(live.begin(), live.end());
  const double unit_step = gs::predict(plan, costs).step_time;
  const double ms_per_unit = step_ms / unit_step;
  costs.latency = delay_ms / ms_per_unit;
  return (gs::predict(plan, costs).step_time - unit_step) * ms_per_unit / delay_ms;
}

// "a,b,c" as its parts.
std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> parts;
  std::stringstream stream(list);
  for (std::string part; std::getline(stream, part, ',');) parts.push_back(part);
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  std::string delays_flag = "0,1,5", schedules_flag = "gpipe,1f1b,zb1p", steps_flag = "30",
              congestion_flag = "cubic";
  const Args args = parse_args(
      argc, argv, "link_delay",
      "gpipe train on 2 ranks in two network namespaces joined by a link with a "
      "one-way delay of 0, 1 and 5 ms (user-space TAP forwarding, not netem): "
      "throughput per schedule, and the step time each ms of delay adds.",
      /*default_rounds=*/3,
      {{"--delays", &delays_flag, "one-way delays in ms, comma-separated; 0 comes first"},
       {"--schedules", &schedules_flag, "the schedules, comma-separated"},
       {"--steps", &steps_flag, "gpipe train's steps per run"},
       {"--congestion", &congestion_flag,
        "TCP congestion control on the link: cubic (Linux's default), bbr, reno; "
        "'machine': this machine's own"}});
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
  std::printf("TCP congestion control on the link: %s\n", congestion.c_str());
  for (int sig : {SIGINT, SIGTERM}) signal(sig, [](int) { interrupted = true; });

  std::vector<int> delays_ms;
  for (const auto& delay : split_list(delays_flag)) delays_ms.push_back(std::stoi(delay));
  if (delays_ms.empty() || delays_ms[0] != 0) {
    std::fprintf(stderr, "link_delay: --delays %s: the first delay must be 0 (the baseline)\n",
                 delays_flag.c_str());
    return 2;
  }
  const std::vector<std::string> schedules = split_list(schedules_flag);
  const char* extra = std::getenv("GPIPE_TRAIN_FLAGS");
  const std::string flags = " train --stages 2 --batch-size " + std::to_string(kBatch) +
                            " --chunks " + std::to_string(kChunks) + " --steps " + steps_flag +
                            (extra ? " " + std::string(extra) : "");
  std::map<int, std::vector<double>> round_trips;                     // by delay
  std::map<std::string, std::map<int, std::vector<double>>> samples;  // by schedule, delay
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
        const double throughput = train(link, flags + " --schedule " + schedule, port++, &error);
        if (throughput == 0 || interrupted) {
          std::fprintf(stderr, "link_delay: %s\n", interrupted ? "interrupted" : error.c_str());
          return 1;
        }
        samples[schedule][delay].push_back(throughput);
        std::printf("round %d, %d ms, %s: %.0f samples/s\n", round + 1, delay, schedule.c_str(),
                    throughput);
        std::fflush(stdout);
      }
    }
  }
  std::printf("\n");

  Table table({"2 ranks, one-way delay", "round trip (ms)", "samples/s", "vs 0 ms", "step (ms)",
               "+step ms per delay ms", "per round: min / median / max", "predict(): per ms"});
  nlohmann::json report = {{"flags", flags},
                           {"congestion_control", congestion},
                           {"rounds", args.rounds},
                           {"delays_ms", delays_ms},
                           {"frames_forwarded", link.forwarded()},
                           {"frames_dropped", link.dropped()},
                           {"seconds", seconds_since(start)}};
  std::string fits;
  for (const auto& schedule : schedules) {
    const double base = median(samples[schedule][0]);
    const double base_step = 1000.0 * kBatch / base;
    // The least-squares slope of the step time over the delays.
    double sum_d = 0, sum_t = 0, sum_dd = 0, sum_dt = 0;
    for (int delay : delays_ms) {
      const double samples_per_second = median(samples[schedule][delay]);
      const double step = 1000.0 * kBatch / samples_per_second;
      const double round_trip = median(round_trips[delay]);
      sum_d += delay, sum_t += step, sum_dd += delay * delay, sum_dt += delay * step;
      const bool delayed = delay > 0;
      const double slope = delayed ? (step - base_step) / delay : 0;
      const double predicted = delayed ? predicted_slope(schedule, base_step, delay) : 0;
      // Each round's own slope, against the same round's run without delay.
      std::vector<double> slopes;
      for (size_t r = 0; delayed && r < samples[schedule][delay].size(); ++r) {
        slopes.push_back(1000.0 * kBatch *
                         (1 / samples[schedule][delay][r] - 1 / samples[schedule][0][r]) / delay);
      }
      const std::string spread =
          slopes.empty() ? ""
                         : fixed(*std::min_element(slopes.begin(), slopes.end()), 2) + " / " +
                               fixed(median(slopes), 2) + " / " +
                               fixed(*std::max_element(slopes.begin(), slopes.end()), 2);
      table.add({schedule + ", " + std::to_string(delay) + " ms", fixed(round_trip, 2),
                 fixed(samples_per_second, 0), times(samples_per_second / base), fixed(step, 1),
                 delayed ? fixed(slope, 2) : "", spread, delayed ? fixed(predicted, 2) : ""});
      report[schedule][std::to_string(delay) + "ms"] = {
          {"samples_per_second", samples_per_second},
          {"step_ms", step},
          {"round_trip_ms", round_trip},
          {"step_ms_per_delay_ms", slope},
          {"step_ms_per_delay_ms_per_round", slopes},
          {"predicted_step_ms_per_delay_ms", predicted}};
    }
    const double n = static_cast<double>(delays_ms.size());
    const double fit = (n * sum_dt - sum_d * sum_t) / (n * sum_dd - sum_d * sum_d);
    report[schedule]["fitted_step_ms_per_delay_ms"] = fit;
    fits += (fits.empty() ? "" : ", ") + schedule + " " + fixed(fit, 2);
  }
  table.print();
  std::printf(
      "\nstep time per ms of one-way delay (least squares over %s ms): %s\n"
      "(a schedule that hid nothing would add 2 for each message round trip on its critical "
      "path; predict(): that count where messages are the only wait)\n"
      "link: %llu frames forwarded, %llu dropped; %.0f s\n",
      delays_flag.c_str(), fits.c_str(), static_cast<unsigned long long>(link.forwarded()),
      static_cast<unsigned long long>(link.dropped()), seconds_since(start));
  write_json(args, report);
  return 0;
}

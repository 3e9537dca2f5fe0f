// `gpipe train` on 2 worker threads of one process against 2 ranks (gpipe launch -n 2), the
// same schedule, seed and flags, round by round: throughput (samples/s, from each run's summary
// line, which leaves out start-up) and each stage's peak, medians side by side. The two train
// the same model bit for bit (TrainRanksTest), so only the engine differs: a shared address
// space and queues against Gloo over loopback, one process per stage.
//
// Then the cost of a snapshot (--save-every): its time (gpipe train's median, from the start of
// the write until it counts on every rank) and the bytes each rank writes, on threads and ranks.
//
// Default: gpipe train's own model and data, 60 steps, schedules 1f1b and gpipe; --rounds N.
#include "common/bench_util.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

using namespace gpipe::bench;

struct Run {
  double samples_per_second = 0;
  std::vector<double> peak_mib;  // per stage
  double snapshot_ms = 0;        // median per snapshot, with --save-every
};

// Runs a command and reads the numbers of gpipe train's summary from its output.
Run run(const std::string& command) {
  std::string output;
  if (run_command(command, &output) != 0) {
    std::fprintf(stderr, "train_ranks: '%s' failed:\n%s\n", command.c_str(), output.c_str());
    std::exit(1);
  }
  Run result;
  std::smatch match;
  if (std::regex_search(output, match, std::regex(R"(, ([0-9.]+) samples/s \()"))) {
    result.samples_per_second = std::stod(match[1]);
  }
  if (std::regex_search(output, match,
                        std::regex(R"(snapshots: [0-9]+ in .*, ([0-9.]+) ms each)"))) {
    result.snapshot_ms = std::stod(match[1]);
  }
  const std::regex peak(R"(stage [0-9]+ ([0-9.]+) MiB)");
  for (std::sregex_iterator it(output.begin(), output.end(), peak), end; it != end; ++it) {
    result.peak_mib.push_back(std::stod((*it)[1]));
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, "train_ranks",
                               "gpipe train on 2 worker threads against 2 ranks (gpipe launch), "
                               "same schedule and seed.",
                               /*default_rounds=*/3);
  const std::string gpipe = GPIPE_COMMAND;
  const std::string flags = " train --steps 60 --stages 2";
  const std::vector<std::string> schedules = {"1f1b", "gpipe"};
  std::map<std::string, std::vector<Run>> runs;  // by contender
  for (int round = 0; round < args.rounds; ++round) {
    for (const auto& schedule : schedules) {
      const std::string train = flags + " --schedule " + schedule;
      runs["threads " + schedule].push_back(run(gpipe + train));
      runs["ranks " + schedule].push_back(run(gpipe + " launch -n 2 -- " + gpipe + train));
    }
  }

  Table table({"gpipe train, 2 stages", "samples/s", "ranks / threads", "peak stage 0, 1 (MiB)"});
  nlohmann::json report = {{"flags", flags}, {"rounds", args.rounds}};
  for (const auto& schedule : schedules) {
    double threads = 0;
    for (const char* engine : {"threads", "ranks"}) {
      const auto& contender = runs[std::string(engine) + " " + schedule];
      std::vector<double> throughput, peak0, peak1;
      for (const auto& r : contender) {
        throughput.push_back(r.samples_per_second);
        peak0.push_back(r.peak_mib.size() > 0 ? r.peak_mib[0] : 0);
        peak1.push_back(r.peak_mib.size() > 1 ? r.peak_mib[1] : 0);
      }
      const double samples = median(throughput);
      if (std::string(engine) == "threads") threads = samples;
      table.add({schedule + ", " + engine, fixed(samples, 0),
                 std::string(engine) == "threads" ? "" : times(samples / threads),
                 fixed(median(peak0), 1) + ", " + fixed(median(peak1), 1)});
      report[schedule][engine] = {{"samples_per_second", samples},
                                  {"peak_mib", {median(peak0), median(peak1)}}};
    }
  }
  table.print();

  // Snapshots every 10 steps of 40, 1F1B: each the median of its run's, each rank's part (the
  // last snapshot's rank-<r>.pt) in MiB.
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("gpipe-train-ranks-" + std::to_string(getpid()));
  const std::string saving = " train --steps 40 --stages 2 --schedule 1f1b --save-every 10";
  Table snapshots({"gpipe train, 2 stages, 1F1B", "ms per snapshot", "MiB written per rank"});
  for (const char* engine : {"threads", "ranks"}) {
    const bool ranks = std::string(engine) == "ranks";
    std::vector<double> milliseconds;
    std::vector<double> rank_mib;
    for (int round = 0; round < args.rounds; ++round) {
      fs::remove_all(dir);
      const std::string train = gpipe + saving + " --snapshot-dir " + dir.string();
      milliseconds.push_back(run(ranks ? gpipe + " launch -n 2 -- " + train : train).snapshot_ms);
    }
    fs::path last;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_directory() && entry.path().filename().string().rfind("step-", 0) == 0 &&
          entry.path() > last) {
        last = entry.path();
      }
    }
    for (int r = 0; r < (ranks ? 2 : 1); ++r) {
      rank_mib.push_back(
          mib(static_cast<double>(fs::file_size(last / ("rank-" + std::to_string(r) + ".pt")))));
    }
    std::string parts;
    for (const double part : rank_mib) parts += (parts.empty() ? "" : ", ") + fixed(part, 1);
    snapshots.add({std::string("1f1b, ") + engine, fixed(median(milliseconds), 0), parts});
    report["snapshot"][engine] = {{"ms", median(milliseconds)}, {"mib_per_rank", rank_mib}};
  }
  fs::remove_all(dir);
  std::printf("\n");
  snapshots.print();
  write_json(args, report);
  return 0;
}

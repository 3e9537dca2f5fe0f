// gpipe train --plan and gpipe plan (tools/gpipe/train_plan.h): the planner on the command's
// model, its choice trained, and the flags it refuses.
#include "test_util.h"

#include "train.h"
#include "train_plan.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

namespace gpipe {
namespace train_plan_test {
namespace {

namespace fs = std::filesystem;
using cli::parse_train_config;
using cli::UsageError;

// A small repetitive text, in a file of its own, and the flags of a tiny model on it.
class TinyRun {
 public:
  TinyRun() {
    std::string pattern = (fs::temp_directory_path() / "gpipe-plan-XXXXXX").string();
    dir_ = mkdtemp(pattern.data());
    std::ofstream text(dir_ / "corpus.txt");
    for (int k = 0; k < 200; ++k) text << "the quick brown fox jumps over the lazy dog. ";
  }
  ~TinyRun() { fs::remove_all(dir_); }
  std::vector<std::string> flags(std::vector<std::string> more) const {
    std::vector<std::string> all{"--data",          (dir_ / "corpus.txt").string(),
                                 "--layers",        "4",
                                 "--embedding-dim", "32",
                                 "--heads",         "2",
                                 "--block-size",    "16",
                                 "--batch-size",    "16",
                                 "--quiet"};
    all.insert(all.end(), more.begin(), more.end());
    return all;
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  std::string command(const std::string& more) const {
    std::string line;
    for (const auto& flag : flags({})) line += " " + flag;
    return line + " " + more;
  }

 private:
  fs::path dir_;
};

TEST(TrainPlanTest, ShowRanksThePlansAndNamesTheChoice) {
  TinyRun run;
  const cli::TrainConfig config = parse_train_config(run.flags({"--plan", "show"}));
  std::ostringstream out;
  const Plan choice = cli::plan_training(config, out);
  EXPECT_NE(out.str().find("2 worker threads, batch 16"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("choice: " + choice.family()), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("profiled in"), std::string::npos);
  EXPECT_EQ(std::accumulate(choice.balance.begin(), choice.balance.end(), int64_t{0}), 6);
  EXPECT_EQ(static_cast<int64_t>(choice.balance.size()), 2 * choice.stages_per_worker);
}

TEST(TrainPlanTest, AutoTrainsWithTheChoiceWithinTheBudget) {
  TinyRun run;
  // A budget between the leanest and the fullest plan: the choice must fit it.
  const cli::TrainConfig free = parse_train_config(run.flags({"--plan", "auto"}));
  std::ostringstream ignored;
  const Plan unbounded = cli::plan_training(free, ignored);
  const double budget_mib = 0.9 * static_cast<double>(unbounded.largest_peak_bytes()) / 1048576.0;
  cli::TrainConfig config = parse_train_config(
      run.flags({"--plan", "auto", "--steps", "3", "--memory-budget", std::to_string(budget_mib)}));
  const Plan choice = cli::plan_training(config, ignored);
  EXPECT_LE(static_cast<double>(choice.largest_peak_bytes()), budget_mib * 1048576.0);

  config = cli::with_plan(config, choice);
  EXPECT_EQ(config.schedule, c10::str(choice.schedule));
  EXPECT_EQ(config.virtual_stages, choice.stages_per_worker);
  EXPECT_EQ(config.chunks, choice.microbatches);
  EXPECT_EQ(config.checkpoint, choice.checkpoint);
  EXPECT_EQ(config.balance, choice.balance);
  EXPECT_EQ(config.stages, static_cast<int64_t>(choice.balance.size()));
  std::ostringstream out;
  const cli::TrainReport report = cli::train(config, out, /*interactive=*/false);
  ASSERT_EQ(report.losses.size(), 3u);
  for (const double loss : report.losses) EXPECT_TRUE(std::isfinite(loss));
}

TEST(TrainPlanTest, FlagsThePlanChoosesAreRefused) {
  TinyRun run;
  for (const char* chosen : {"--schedule", "--chunks", "--checkpoint"}) {
    const std::string value = std::string(chosen) == "--schedule"     ? "1f1b"
                              : std::string(chosen) == "--checkpoint" ? "always"
                                                                      : "4";
    GPIPE_EXPECT_THROW_WITH(parse_train_config(run.flags({"--plan", "auto", chosen, value})),
                            UsageError, std::string("--plan chooses ") + chosen);
  }
  GPIPE_EXPECT_THROW_WITH(parse_train_config(run.flags({"--plan", "show", "--simulate"})),
                          UsageError, "--plan and --simulate");
  GPIPE_EXPECT_THROW_WITH(parse_train_config(run.flags({"--plan", "maybe"})), UsageError, "--plan");
}

TEST(TrainPlanTest, TheCommandPlansOnThreadsOnly) {
  TinyRun run;
  // Runs the gpipe binary; returns its exit code and its stderr.
  const auto gpipe = [&](const std::string& environment, const std::string& arguments) {
    const std::string err = run.file("stderr");
    const int status = std::system((environment + " " + GPIPE_COMMAND + " " + arguments +
                                    run.command("") + " >/dev/null 2>" + err)
                                       .c_str());
    std::stringstream text;
    text << std::ifstream(err).rdbuf();
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str());
  };
  EXPECT_EQ(gpipe("", "plan").first, 0);
  // As one rank of a job it refuses (exit 2): each rank would profile and choose on its own.
  const auto [code, message] =
      gpipe("WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1", "plan");
  EXPECT_EQ(code, 2);
  EXPECT_NE(message.find("--plan profiles and plans worker threads of one process"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace train_plan_test
}  // namespace gpipe

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

// `gpipe plan --load FILE` plans the saved model, with its sizes, as training would.
TEST(TrainPlanTest, PlansTheSizesOfAModelFile) {
  TinyRun run;
  const std::string saved = run.file("model.pt");
  std::ostringstream ignored;
  cli::train(parse_train_config({"--data", run.file("corpus.txt"), "--layers", "2",
                                 "--embedding-dim", "24", "--heads", "2", "--block-size", "16",
                                 "--batch-size", "16", "--steps", "1", "--quiet", "--save", saved}),
             ignored, /*interactive=*/false);
  // The default model has 4 blocks of width 128; the file 2 of width 24.
  const cli::TrainConfig config =
      parse_train_config({"--data", run.file("corpus.txt"), "--batch-size", "16", "--quiet",
                          "--plan", "show", "--load", saved});
  std::ostringstream out;
  const Plan choice = cli::plan_training(config, out);
  EXPECT_EQ(std::accumulate(choice.balance.begin(), choice.balance.end(), int64_t{0}), 4)
      << out.str();  // 2 blocks, the embedding and the head
  EXPECT_NE(out.str().find("char GPT (2 blocks, width 24,"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find(" from " + saved), std::string::npos) << out.str();
}

// On ranks, rank 0 plans and the others train its choice: they print nothing of their own.
// Where nothing fits, every rank fails with rank 0's reasons rather than waiting for a choice.
TEST(TrainPlanTest, TheCommandPlansOnRanks) {
  TinyRun run;
  // Runs `gpipe launch -n 2 -- gpipe <arguments>`; returns its exit code and its output.
  const auto on_ranks = [&](const std::string& arguments) {
    const std::string out = run.file("out");
    const int status =
        std::system((std::string(GPIPE_COMMAND) + " launch -n 2 --grace 5 -- " + GPIPE_COMMAND +
                     " " + arguments + run.command("") + " >" + out + " 2>&1")
                        .c_str());
    std::stringstream text;
    text << std::ifstream(out).rdbuf();
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str());
  };
  const auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const auto [shown, plans] = on_ranks("plan");
  EXPECT_EQ(shown, 0) << plans;
  EXPECT_EQ(count(plans, "gpipe train --plan: 2 ranks, planned as worker threads of rank 0"), 1u)
      << plans;
  EXPECT_EQ(count(plans, "choice: "), 1u) << plans;

  // Ranks that trained different choices would fail to pair their messages.
  const auto [trained, output] = on_ranks("train --plan auto --steps 2");
  EXPECT_EQ(trained, 0) << output;
  EXPECT_EQ(count(output, "choice: "), 1u) << output;

  const auto [failed, message] = on_ranks("plan --memory-budget 0.01");
  EXPECT_NE(failed, 0) << message;
  EXPECT_NE(message.find("no plan fits"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 could not plan: no plan fits"), std::string::npos) << message;
}

}  // namespace
}  // namespace train_plan_test
}  // namespace gpipe

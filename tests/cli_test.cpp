// The `gpipe` command: flag parsing and its errors, the training text, that `gpipe train` makes
// the loss fall, that its trace is JSON with one event per task and its timeline is SVG, saving
// and generating, and the exit codes of the binary.
#include "test_util.h"

#include "arguments.h"
#include "detail/compat.h"
#include "generate.h"
#include "model_file.h"
#include "same_model.h"
#include "text_corpus.h"
#include "trace_merge.h"
#include "train.h"
#include "train_simulate.h"

#include <gpipe/schedule/generators.h>
#include <gpipe/schedule/schedule_file.h>

#include <tinyxml2.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

namespace gpipe {
namespace cli {
namespace cli_test {
namespace {

namespace fs = std::filesystem;

// A fresh directory for one test's files, removed afterwards.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    std::string pattern = (fs::temp_directory_path() / "gpipe-cli-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TemporaryDirectory() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

std::string write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// A small, repetitive text that a tiny model learns within a few dozen steps.
std::string tiny_corpus(const TemporaryDirectory& dir) {
  std::string text;
  for (int k = 0; k < 200; ++k) text += "the quick brown fox jumps over the lazy dog. ";
  return write_text(dir.file("corpus.txt"), text);
}

std::vector<std::string> tiny_model_flags(const std::string& data) {
  return {"--data",       data, "--layers",     "2",  "--embedding-dim", "32", "--heads", "2",
          "--block-size", "16", "--batch-size", "16", "--quiet"};
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A command line with one flag of each kind, as the subcommands make them.
struct Flags {
  int64_t steps = 1;
  double lr = 1;
  bool quiet = false;
  std::string mode = "a";
  std::unique_ptr<CLI::App> app =
      command_line("gpipe test [flags]", "A command line for the tests.");
  Flags() {
    app->add_option("--steps", steps, "steps")->check(at_least(1));
    app->add_option("--lr", lr, "learning rate")->check(greater_than(0));
    app->add_flag("--quiet", quiet, "quiet");
    app->add_option("--mode", mode, "mode")->check(one_of({"a", "b"}));
  }
};

TEST(ArgumentsTest, ValuesInBothForms) {
  Flags f;
  parse(*f.app, {"--steps", "20", "--lr=0.5", "--quiet", "--mode", "b"});
  EXPECT_EQ(f.steps, 20);
  EXPECT_EQ(f.lr, 0.5);
  EXPECT_TRUE(f.quiet);
  EXPECT_EQ(f.mode, "b");
  Flags defaults;
  parse(*defaults.app, {});
  EXPECT_EQ(defaults.steps, 1);
  EXPECT_FALSE(defaults.quiet);
}

TEST(ArgumentsTest, Errors) {
  const auto error = [](const std::vector<std::string>& args) -> std::string {
    Flags f;
    try {
      parse(*f.app, args);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(error({"train"}), "unexpected argument 'train' (flags look like --name value)");
  EXPECT_EQ(error({"--steps", "1", "--steps", "2"}), "--steps is given twice");
  EXPECT_EQ(error({"--steps", "x"}), "--steps: must be an integer, but got 'x'");
  EXPECT_EQ(error({"--steps", "12abc"}), "--steps: must be an integer, but got '12abc'");
  EXPECT_EQ(error({"--steps", "0"}), "--steps: must be at least 1, but got 0");
  EXPECT_EQ(error({"--steps", "-3"}), "--steps: must be at least 1, but got -3");
  EXPECT_EQ(error({"--steps=-3"}), "--steps: must be at least 1, but got -3");
  EXPECT_EQ(error({"--lr", "-1"}), "--lr: must be greater than 0, but got -1");
  EXPECT_EQ(error({"--steps"}), "--steps needs a value");
  EXPECT_EQ(error({"--mode", "x"}), "--mode: must be one of a, b, but got 'x'");
  EXPECT_EQ(error({"--steps", "3", "--stpes", "4"}), "unknown flag --stpes (see --help)");
  // The help lists every flag with its default.
  Flags f;
  EXPECT_THAT(f.app->help(), ::testing::HasSubstr("--steps"));
  EXPECT_THAT(train_usage(), ::testing::HasSubstr("--virtual-stages"));
  EXPECT_THAT(generate_usage(), ::testing::HasSubstr("--temperature"));
}

TEST(TrainConfigTest, DefaultsAreTheDefaultJob) {
  const TrainConfig c = parse_train_config({});
  EXPECT_EQ(c.data, std::vector<std::string>{kDefaultCorpusDirectory});
  EXPECT_EQ(c.stages, 2);
  EXPECT_EQ(c.schedule, "1f1b");
  EXPECT_EQ(c.checkpoint, CheckpointMode::kNever);
  EXPECT_EQ(c.model.num_layers(), 4);
  EXPECT_TRUE(c.model.tie_embeddings());
  EXPECT_EQ(c.precision, "fp32");
  EXPECT_EQ(c.clip_grad_norm, 0);
  EXPECT_EQ(c.eval_every, 0);
  EXPECT_FALSE(parse_train_config({"--untie"}).model.tie_embeddings());
}

TEST(TrainConfigTest, Errors) {
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--stages", "7"}), UsageError,
                          "--stages 7 is more than the model's 6 layers (--layers 4 blocks + "
                          "embedding + head)");
  GPIPE_EXPECT_THROW_WITH(
      parse_train_config({"--schedule", "2f2b"}), UsageError,
      "--schedule: must be one of gpipe, 1f1b, interleaved_1f1b, zb1p, zbv, interleaved_zb1p, "
      "looped_bfs, dualpipev, v_min, v_half, but got '2f2b'");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--schedule", "zb1p", "--checkpoint", "always"}),
                          UsageError,
                          "--schedule zb1p splits each backward into input and weight gradients, "
                          "which --checkpoint cannot: use --checkpoint with gpipe, 1f1b, "
                          "interleaved_1f1b or looped_bfs");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--heads", "3"}), UsageError,
                          "--heads 3 must divide --embedding-dim 128");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--load", "m.pt", "--layers", "2"}), UsageError,
                          "--layers cannot change a model read with --load");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--devices", "cpu"}), UsageError,
                          "--devices names 1 devices for --stages 2");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--devices", "cpu,gpu7"}), UsageError,
                          "--devices: 'gpu7' is not a device");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--receive-window", "2"}), UsageError,
                          "--receive-window applies to ranks, whose stages exchange messages; on "
                          "threads they pass tensors");
  GPIPE_EXPECT_THROW_WITH(
      parse_train_config({"--virtual-stages", "2"}), UsageError,
      "--schedule 1f1b runs one stage per worker, but --virtual-stages is 2 "
      "(more than 1 only with interleaved_1f1b, interleaved_zb1p and looped_bfs; 2 with "
      "zbv, dualpipev, v_min and v_half)");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--schedule", "zbv", "--stages", "4"}), UsageError,
                          "--schedule zbv runs two stages per worker in a V, but --virtual-stages "
                          "is 1 (set it to 2)");
  GPIPE_EXPECT_THROW_WITH(
      parse_train_config({"--schedule", "dualpipev", "--stages", "4", "--virtual-stages", "2",
                          "--chunks", "8", "--batch-size", "3"}),
      UsageError,
      "--schedule dualpipev needs at least 4 micro-batches for --stages 4, but "
      "--chunks is 8 and --batch-size 3");
  GPIPE_EXPECT_THROW_WITH(
      parse_train_config({"--checkpoint", "sometimes"}), UsageError,
      "--checkpoint: must be one of never, always, except_last, but got 'sometimes'");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--precision", "fp8"}), UsageError,
                          "--precision: must be one of fp32, bf16, fp16, but got 'fp8'");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--clip-grad-norm", "-1"}), UsageError,
                          "--clip-grad-norm");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--eval-every", "0"}), UsageError, "--eval-every");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--loss-scale", "8"}), UsageError,
                          "--loss-scale needs --precision fp16");
  GPIPE_EXPECT_THROW_WITH(parse_train_config({"--load", "m.pt", "--untie"}), UsageError,
                          "--untie cannot change a model read with --load");
}

TEST(TextCorpusTest, LoadsFilesAndDirectories) {
  TemporaryDirectory dir;
  write_text(dir.file("b.txt"), "world");
  write_text(dir.file("a.txt"), "hello ");
  const auto corpus = TextCorpus::load({dir.file("a.txt"), dir.file("b.txt")}, 1);
  EXPECT_EQ(corpus.size(), 11);
  const auto whole = TextCorpus::load({dir.file("")}, 1);  // sorted by name: a.txt, b.txt
  EXPECT_EQ(whole.size(), 11);
  EXPECT_EQ(whole.num_files(), 2);
  GPIPE_EXPECT_THROW_WITH(TextCorpus::load({dir.file("missing.txt")}, 1), UsageError,
                          "missing.txt' does not exist or is not a file");
  GPIPE_EXPECT_THROW_WITH(TextCorpus::load({dir.file("a.txt")}, 65), UsageError,
                          "the training text has 6 bytes, but needs at least 65");
}

TEST(TextCorpusTest, TargetsAreInputsShiftedByOne) {
  TemporaryDirectory dir;
  const auto corpus = TextCorpus::load({write_text(dir.file("t.txt"), "abcdefghijklmnop")}, 1);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(3);
  auto [input, target] = corpus.batch(5, 4, generator);
  EXPECT_EQ(input.sizes(), (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(input.scalar_type(), torch::kLong);
  // Consecutive letters: each target is its input + 1.
  EXPECT_TRUE(torch::equal(target, input + 1));
  EXPECT_TRUE(torch::equal(input.narrow(1, 1, 3), target.narrow(1, 0, 3)));
}

TEST(TrainTest, LossFalls) {
  TemporaryDirectory dir;
  std::ostringstream out;
  // 40 steps: the char GPT ties its head to its embedding, which starts slower.
  const TrainConfig config = parse_train_config(tiny_model_flags(tiny_corpus(dir)) +
                                                std::vector<std::string>{"--steps", "40"});
  const TrainReport report = train(config, out, /*interactive=*/false);
  ASSERT_EQ(report.losses.size(), 40u);
  const auto mean = [&](size_t from, size_t to) {
    double sum = 0;
    for (size_t k = from; k < to; ++k) sum += report.losses[k];
    return sum / static_cast<double>(to - from);
  };
  // ln(256) = 5.5 at the start; a repetitive text is quickly learned.
  EXPECT_GT(mean(0, 5), 4.5);
  EXPECT_LT(mean(35, 40), mean(0, 5) - 1.5);
  EXPECT_EQ(report.peak_bytes_per_stage.size(), 2u);
  for (const auto bytes : report.peak_bytes_per_stage) EXPECT_GT(bytes, 0);
  EXPECT_THAT(out.str(), ::testing::HasSubstr("done: 40 steps"));
  EXPECT_THAT(out.str(), ::testing::HasSubstr("bubble: "));
}

// Mixed precision, clipping and validation on held-out text: the loss falls in bf16 and fp16 as
// in fp32, the validation loss comes every --eval-every steps and at the end, fp16's scaler
// reports its scale.
TEST(TrainTest, PrecisionClippingAndValidation) {
  TemporaryDirectory dir;
  const auto flags =
      tiny_model_flags(tiny_corpus(dir)) +
      std::vector<std::string>{"--steps", "20", "--clip-grad-norm", "1", "--eval-every", "8"};
  std::map<std::string, TrainReport> reports;
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    std::ostringstream out;
    auto loud = flags;
    loud.erase(std::find(loud.begin(), loud.end(), "--quiet"));
    if (!GPIPE_LIBTORCH_2 && precision == "fp16") {
      GPIPE_EXPECT_THROW_WITH(
          parse_train_config(loud + std::vector<std::string>{"--precision", precision}), UsageError,
          "--precision fp16: LibTorch 1.13's autocast on cpu runs in BFloat16 only, not Half");
      continue;
    }
    reports[precision] = train(
        parse_train_config(loud + std::vector<std::string>{"--precision", precision}), out, false);
    const TrainReport& report = reports[precision];
    ASSERT_EQ(report.validation_losses.size(), 3u) << precision;
    EXPECT_EQ(report.validation_losses[0].first, 8);
    EXPECT_EQ(report.validation_losses[2].first, 20);
    EXPECT_LT(report.validation_losses[2].second, report.validation_losses[0].second) << precision;
    EXPECT_THAT(out.str(), ::testing::HasSubstr("step 8: validation loss "));
    EXPECT_THAT(out.str(), ::testing::HasSubstr("precision " + precision));
    EXPECT_THAT(out.str(), ::testing::HasSubstr("gradients clipped to norm 1"));
    EXPECT_THAT(out.str(), ::testing::HasSubstr("tied embeddings"));
    if (precision == "fp16") EXPECT_THAT(out.str(), ::testing::HasSubstr("loss scale "));
  }
  // Lower precision follows fp32's curve.
  for (const std::string precision : {"bf16", "fp16"}) {
    if (!reports.count(precision)) continue;
    EXPECT_NEAR(reports[precision].losses.back(), reports["fp32"].losses.back(), 0.1) << precision;
  }
}

TEST(TrainTest, EveryScheduleTrainsTheSameModel) {
  // Same seed, same batches: every schedule computes the same losses and gradients, so the loss
  // after a few updates agrees too. Each is measured against its own bubble.
  TemporaryDirectory dir;
  const std::string data = tiny_corpus(dir);
  std::vector<double> first;
  for (const auto& flags : std::vector<std::vector<std::string>>{
           {"--schedule", "1f1b"},
           {"--schedule", "gpipe", "--checkpoint", "except_last"},
           {"--schedule", "interleaved_1f1b", "--stages", "4", "--virtual-stages", "2"},
           {"--schedule", "zb1p", "--stages", "3", "--chunks", "6"},
           {"--schedule", "zbv", "--stages", "4", "--virtual-stages", "2", "--chunks", "4"}}) {
    std::ostringstream out;
    const TrainConfig config = parse_train_config(tiny_model_flags(data) +
                                                  std::vector<std::string>{"--steps", "4"} + flags);
    const TrainReport report = train(config, out, false);
    // The schedule's own bubble: (W - 1) / (M v + W - 1) for GPipe and (interleaved) 1F1B, less
    // for the zero-bubble schedules.
    const double W = static_cast<double>(config.stages / config.virtual_stages);
    const double M = static_cast<double>(config.chunks), v = config.virtual_stages;
    const double one_f_one_b = (W - 1) / (M * v + W - 1);
    if (flags[1] == "zb1p" || flags[1] == "zbv") {
      EXPECT_LT(report.bubble_bound, one_f_one_b - 0.01) << flags[1];
      EXPECT_GE(report.bubble_bound, 0) << flags[1];
    } else {
      EXPECT_NEAR(report.bubble_bound, one_f_one_b, 1e-12) << flags[1];
    }
    if (first.empty()) {
      first = report.losses;
      continue;
    }
    for (size_t k = 0; k < first.size(); ++k) {
      EXPECT_NEAR(report.losses[k], first[k], 1e-4) << flags[1] << ", step " << k;
    }
  }
}

TEST(TrainTest, TraceHasOneEventPerTaskAndTimelineIsSvg) {
  TemporaryDirectory dir;
  const int64_t steps = 3, stages = 3, chunks = 4;
  std::ostringstream out;
  const TrainConfig config = parse_train_config(
      tiny_model_flags(tiny_corpus(dir)) +
      std::vector<std::string>{"--steps", std::to_string(steps), "--stages", std::to_string(stages),
                               "--chunks", std::to_string(chunks), "--checkpoint", "always",
                               "--trace", dir.file("trace.json"), "--timeline",
                               dir.file("timeline.svg"), "--timeline-steps", "1"});
  const TrainReport report = train(config, out, false);

  std::ifstream in(dir.file("trace.json"));
  const nlohmann::json trace = nlohmann::json::parse(in);  // throws unless valid JSON
  const auto planned =
      schedule::make_schedule(schedule::ScheduleKind::kOneFOneB, stages, stages, chunks);
  int64_t tasks_per_step = 0;
  for (const auto& actions : planned.actions) tasks_per_step += actions.size();
  // Checkpointing adds one recompute per backward, on every stage.
  tasks_per_step += stages * chunks;
  int64_t complete = 0, recomputes = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t, std::string>, int> seen;
  for (const auto& event : trace.at("traceEvents")) {
    if (event.at("ph") != "X") continue;
    ++complete;
    const std::string name = event.at("name");
    recomputes += name == "recompute";
    ++seen[{event.at("args").at("step").get<int64_t>(), event.at("args").at("stage").get<int64_t>(),
            event.at("args").at("microbatch").get<int64_t>(), name}];
    EXPECT_GE(event.at("dur").get<double>(), 0);
  }
  EXPECT_EQ(complete, steps * tasks_per_step);
  EXPECT_EQ(report.traced_tasks, complete);
  EXPECT_EQ(recomputes, steps * stages * chunks);
  for (const auto& [key, count] : seen) EXPECT_EQ(count, 1) << std::get<3>(key);  // one each

  tinyxml2::XMLDocument svg;
  ASSERT_EQ(svg.LoadFile(dir.file("timeline.svg").c_str()), tinyxml2::XML_SUCCESS)
      << svg.ErrorStr();
  ASSERT_STREQ(svg.RootElement()->Name(), "svg");
  int rects = 0;
  for (auto* e = svg.RootElement()->FirstChildElement("rect"); e;
       e = e->NextSiblingElement("rect")) {
    ++rects;
  }
  // The background, the last step's tasks, six legend boxes.
  EXPECT_EQ(rects, 1 + tasks_per_step + 6);
}

TEST(TrainTest, SaveThenGenerate) {
  TemporaryDirectory dir;
  std::ostringstream out;
  const TrainConfig config =
      parse_train_config(tiny_model_flags(tiny_corpus(dir)) +
                         std::vector<std::string>{"--steps", "20", "--save", dir.file("model.pt")});
  train(config, out, false);
  const SavedModel saved = load_model(dir.file("model.pt"));
  EXPECT_EQ(saved.options.num_layers(), 2);
  EXPECT_EQ(saved.options.embedding_dim(), 32);
  EXPECT_EQ(saved.model->size(), 4u);

  std::ostringstream text;
  GenerateConfig generate_config = parse_generate_config(
      {"--model", dir.file("model.pt"), "--prompt", "the ", "--length", "25"});
  generate(generate_config, text);
  EXPECT_EQ(text.str().size(), 4u + 25u + 1u);  // prompt, continuation, newline
  EXPECT_EQ(text.str().substr(0, 4), "the ");

  // The same seed samples the same text.
  std::ostringstream again;
  generate(generate_config, again);
  EXPECT_EQ(again.str(), text.str());

  // Training goes on from the saved weights: its first loss is the saved model's loss.
  std::ostringstream resumed_out;
  const TrainReport resumed =
      train(parse_train_config({"--data", dir.file("corpus.txt"), "--load", dir.file("model.pt"),
                                "--batch-size", "16", "--steps", "1", "--quiet"}),
            resumed_out, false);
  std::ostringstream fresh_out;
  const TrainReport from_scratch =
      train(parse_train_config(tiny_model_flags(dir.file("corpus.txt")) +
                               std::vector<std::string>{"--steps", "1"}),
            fresh_out, false);
  EXPECT_LT(resumed.losses[0], from_scratch.losses[0] - 0.5);

  GPIPE_EXPECT_THROW_WITH(load_model(dir.file("missing.pt")), UsageError, "does not exist");
  GPIPE_EXPECT_THROW_WITH(load_model(write_text(dir.file("junk.pt"), "junk")), UsageError,
                          "is not a model saved by gpipe train --save");
  GPIPE_EXPECT_THROW_WITH(parse_generate_config({}), UsageError, "needs --model FILE");
}

TEST(TrainTest, FailedSaveKeepsThePreviousFile) {
  TemporaryDirectory dir;
  models::CharGPTOptions options;
  options.num_layers(1).embedding_dim(8).num_heads(2).block_size(4);
  torch::manual_seed(0);
  torch::nn::Sequential first = models::char_gpt(options);
  const std::string path = dir.file("model.pt");
  save_model(path, first, options);
  EXPECT_FALSE(fs::exists(path + ".partial"));  // a save that succeeds leaves nothing beside
  const auto read_bytes = [&] {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string saved = read_bytes();
  ASSERT_FALSE(saved.empty());

  // The temporary file cannot be written: a folder, not empty, stands in its place.
  fs::create_directories(path + ".partial/blocker");
  torch::nn::Sequential second = models::char_gpt(options);
  GPIPE_EXPECT_THROW_WITH(save_model(path, second, options), std::runtime_error,
                          "cannot save the model to '" + path + "'");
  EXPECT_EQ(read_bytes(), saved);
  EXPECT_EQ(load_model(path).options.num_layers(), 1);
}

// Runs the gpipe binary; returns its exit code and what it wrote to stderr.
std::pair<int, std::string> run_command(const std::string& arguments) {
  TemporaryDirectory dir;
  const std::string command =
      std::string(GPIPE_COMMAND) + " " + arguments + " >/dev/null 2>" + dir.file("stderr");
  const int status = std::system(command.c_str());
  std::ifstream in(dir.file("stderr"));
  std::stringstream err;
  err << in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, err.str()};
}

TEST(CommandTest, BadCommandLinesExitWithTwoAndOneLine) {
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"train --bogus 1", "gpipe train: unknown flag --bogus (see --help)\n"},
           {"train --data /nonexistent/text",
            "gpipe train: data file '/nonexistent/text' does not exist or is not a file\n"},
           {"train --stages 9",
            "gpipe train: --stages 9 is more than the model's 6 layers (--layers 4 blocks + "
            "embedding + head)\n"},
           {"train --steps -3", "gpipe train: --steps: must be at least 1, but got -3\n"},
           {"generate", "gpipe generate: needs --model FILE (from gpipe train --save)\n"},
           {"fly", "gpipe fly: unknown command 'fly' (commands: train, plan, generate, launch, trace)\n"},
           {"trace split a.json",
            "gpipe trace: unknown trace command 'split' (trace commands: merge)\n"},
           {"trace merge a.json", "gpipe trace merge: needs -o FILE, the merged trace\n"},
       }) {
    const auto [code, err] = run_command(arguments);
    EXPECT_EQ(code, 2) << arguments;
    EXPECT_EQ(err, message) << arguments;
  }
}

TEST(CommandTest, LaunchStartsRanksWithTheirEnvironment) {
  TemporaryDirectory dir;
  const auto [code, err] =
      run_command("launch -n 3 -- sh -c 'echo $RANK/$WORLD_SIZE > " + dir.file("rank") + "$RANK'");
  EXPECT_EQ(code, 0) << err;
  for (int rank = 0; rank < 3; ++rank) {
    std::ifstream in(dir.file("rank" + std::to_string(rank)));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, std::to_string(rank) + "/3");
  }
  const auto [failed, message] = run_command("launch -n 2 --grace 5 -- sh -c 'exit $RANK'");
  EXPECT_EQ(failed, 1);
  EXPECT_THAT(message, ::testing::HasSubstr("gpipe launch: rank 1 exited with status 1"));
  // --max-restarts: all ranks start again after one fails, each attempt numbered, until one
  // succeeds or no restart is left.
  const auto [restarted, restart_message] = run_command(
      "launch -n 2 --max-restarts 3 --grace 5 -- sh -c 'echo $TORCHELASTIC_RESTART_COUNT >> " +
      dir.file("attempts") + "$RANK; [ $TORCHELASTIC_RESTART_COUNT = 2 ] || [ $RANK = 0 ]'");
  EXPECT_EQ(restarted, 0) << restart_message;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir.file("attempts" + std::to_string(rank)));
    std::stringstream attempts;
    attempts << in.rdbuf();
    EXPECT_EQ(attempts.str(), "0\n1\n2\n") << "rank " << rank;
  }
  EXPECT_THAT(restart_message,
              ::testing::HasSubstr("gpipe launch: restarting all 2 ranks (restart 2 of 3)"));
  const auto [exhausted, exhausted_message] =
      run_command("launch -n 2 --max-restarts 1 --grace 5 -- sh -c 'exit $RANK'");
  EXPECT_EQ(exhausted, 1);
  EXPECT_THAT(exhausted_message, ::testing::HasSubstr("restart 1 of 1"));
  EXPECT_THAT(exhausted_message, ::testing::HasSubstr("failed: rank 1 failed first"));
  EXPECT_EQ(run_command("launch -- true").first, 2);  // no -n
}

TEST(CommandTest, HelpExitsWithZero) {
  // --help or -h in any position wins over every other flag, even a bad one.
  for (const std::string arguments :
       {"--help", "-h", "train --help", "train --steps 5 --help", "train -h --bogus 1",
        "train --stages 99 --help", "generate --help", "generate --model missing.pt -h",
        "launch --help", "launch -n 2 --help -- true", "launch -n -h"}) {
    const auto [code, err] = run_command(arguments);
    EXPECT_EQ(code, 0) << arguments;
    EXPECT_EQ(err, "") << arguments;
  }
  // After --, a --help belongs to the program the launcher starts.
  EXPECT_EQ(run_command("launch -n 1 --grace 1 -- sh -c 'exit 3' --help").first, 1);
  EXPECT_EQ(run_command("").first, 2);  // no command: usage on stderr
}

TEST(CommandTest, BadOutputPathsStopBeforeTraining) {
  TemporaryDirectory dir;
  // So many steps that training first would time the test out.
  const std::string train = "train --steps 1000000 --quiet ";
  for (const char* flag : {"--save", "--trace", "--timeline"}) {
    const auto [code, err] = run_command(train + flag + " /nonexistent-gpipe-folder/out");
    EXPECT_EQ(code, 2) << flag;
    EXPECT_EQ(err, std::string("gpipe train: ") + flag +
                       " '/nonexistent-gpipe-folder/out': folder '/nonexistent-gpipe-folder' "
                       "does not exist\n");
    const auto [folder_code, folder_err] = run_command(train + flag + " " + dir.path());
    EXPECT_EQ(folder_code, 2) << flag;
    EXPECT_EQ(folder_err, std::string("gpipe train: ") + flag + " '" + dir.path() +
                              "' is a folder; it needs a file name\n");
  }
}

TEST(CommandTest, MissingDevicesAreOneLine) {
  const std::string train = "train --steps 1000000 --quiet --stages 2 --devices ";
  const auto [code, err] = run_command(train + "cpu,cuda:64");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(err, ::testing::StartsWith("gpipe train: --devices: 'cuda:64' does not exist (this "
                                         "machine has "));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(run_command(train + "cpu,mps"),
            std::make_pair(2, std::string("gpipe train: --devices: 'mps' is not a cpu or cuda "
                                          "device\n")));
  EXPECT_EQ(run_command(train + "cpu,bogus"),
            std::make_pair(2, std::string("gpipe train: --devices: 'bogus' is not a device (e.g. "
                                          "cpu, cuda:0)\n")));
}

// Runs `gpipe train` with `flags` as `ranks` ranks under `gpipe launch`; returns the exit code
// and what every rank printed.
std::pair<int, std::string> train_on_ranks(int ranks, const std::vector<std::string>& flags) {
  TemporaryDirectory dir;
  std::string command = std::string(GPIPE_COMMAND) + " launch -n " + std::to_string(ranks) +
                        " --grace 10 -- " + GPIPE_COMMAND + " train";
  for (const auto& flag : flags) command += " '" + flag + "'";
  const int status = std::system((command + " >" + dir.file("output") + " 2>&1").c_str());
  std::ifstream in(dir.file("output"));
  std::stringstream output;
  output << in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output.str()};
}

int64_t count(const std::string& text, const std::string& part) {
  int64_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// `gpipe train` as the ranks of a multi-process pipeline trains, bit for bit, the model that
// its worker threads train with the same flags, under each schedule; rank 0 alone reports,
// with every stage's peak, and writes the outputs: one trace and one timeline of every rank.
// --simulate trains nothing: it predicts every schedule the model allows and names the fastest
// within the budget.
TEST(TrainTest, SimulatePredictsEverySchedule) {
  TemporaryDirectory dir;
  const auto flags = tiny_model_flags(tiny_corpus(dir)) +
                     std::vector<std::string>{"--simulate", "--stages", "2", "--chunks", "4"};
  std::ostringstream out;
  const SimulateReport report = simulate_schedules(parse_train_config(flags), out);
  std::vector<std::string> names;
  for (const auto& f : report.forecasts) {
    names.push_back(f.schedule);
    EXPECT_GT(f.step_seconds, 0) << f.schedule;
    EXPECT_GT(f.peak_worker_bytes, 0) << f.schedule;
    EXPECT_TRUE(f.fits) << f.schedule;
    const auto kind = schedule::parse_schedule_kind(f.schedule);
    EXPECT_EQ(f.stages, schedule::loops_stages(kind) ||
                                schedule::placement_of(kind) == schedule::Placement::kV
                            ? 4
                            : 2);
    EXPECT_THAT(out.str(), ::testing::HasSubstr("\n" + f.schedule + " ")) << out.str();
  }
  std::vector<std::string> expected = schedule::schedule_names();
  std::sort(names.begin(), names.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
  EXPECT_THAT(out.str(), ::testing::HasSubstr("fastest: " + report.fastest + "\n"));
  // GPipe holds every micro-batch, 1F1B at most 2 on 2 stages.
  EXPECT_GT(report.forecasts[0].peak_worker_bytes, report.forecasts[1].peak_worker_bytes);

  // A budget only 1F1B's activations fit in.
  const double one_f_one_b_mib =
      static_cast<double>(report.forecasts[1].peak_worker_bytes) / 1048576;
  std::ostringstream tight;
  const SimulateReport within = simulate_schedules(
      parse_train_config(flags + std::vector<std::string>{"--memory-budget",
                                                          std::to_string(one_f_one_b_mib * 1.05)}),
      tight);
  EXPECT_FALSE(within.forecasts[0].fits);
  EXPECT_THAT(tight.str(), ::testing::HasSubstr("(over budget)"));
  std::ostringstream none;
  EXPECT_EQ(
      simulate_schedules(
          parse_train_config(flags + std::vector<std::string>{"--memory-budget", "0.000001"}), none)
          .fastest,
      "");
  EXPECT_THAT(none.str(), ::testing::HasSubstr("no schedule fits within --memory-budget"));
  EXPECT_EQ(report.left_out, std::vector<std::string>{});

  // DualPipeV over 4 stages needs 4 micro-batches: with 2 it is left out, and said so.
  std::ostringstream few;
  const SimulateReport two = simulate_schedules(
      parse_train_config(tiny_model_flags(tiny_corpus(dir)) +
                         std::vector<std::string>{"--simulate", "--stages", "2", "--chunks", "2"}),
      few);
  EXPECT_EQ(two.left_out, std::vector<std::string>{"dualpipev (needs at least 4 micro-batches)"});
  EXPECT_EQ(two.forecasts.size(), expected.size() - 1);
  EXPECT_THAT(few.str(),
              ::testing::HasSubstr("not predicted: dualpipev (needs at least 4 micro-batches)\n"));
}

// --schedule-file: ZBV written to a file trains the model --schedule zbv trains, on threads and
// on 2 ranks; its stages and micro-batches are --stages and --chunks.
TEST(TrainTest, ScheduleFileTrainsAsItsSchedule) {
  TemporaryDirectory dir;
  const auto flags = tiny_model_flags(tiny_corpus(dir)) + std::vector<std::string>{"--steps", "3"};
  const std::string file = dir.file("zbv.txt");
  std::ofstream(file) << schedule::write_schedule(schedule::zbv_schedule(2, 4));
  std::ostringstream out;
  const TrainReport zbv = train(
      parse_train_config(flags + std::vector<std::string>{"--schedule", "zbv", "--stages", "4",
                                                          "--virtual-stages", "2", "--chunks", "4",
                                                          "--save", dir.file("zbv.pt")}),
      out, false);
  const TrainConfig c = parse_train_config(
      flags + std::vector<std::string>{"--schedule-file", file, "--save", dir.file("file.pt")});
  EXPECT_EQ(c.stages, 4);
  EXPECT_EQ(c.chunks, 4);
  EXPECT_EQ(c.virtual_stages, 2);
  const TrainReport from_file = train(c, out, false);
  EXPECT_EQ(from_file.losses, zbv.losses);
  testing::expect_same_model(dir.file("file.pt"), dir.file("zbv.pt"));
  const auto [code, output] = train_on_ranks(
      2, flags + std::vector<std::string>{"--schedule-file", file, "--save", dir.file("ranks.pt")});
  ASSERT_EQ(code, 0) << output;
  testing::expect_same_model(dir.file("ranks.pt"), dir.file("zbv.pt"));

  GPIPE_EXPECT_THROW_WITH(
      parse_train_config(flags +
                         std::vector<std::string>{"--schedule-file", file, "--stages", "2"}),
      UsageError, "--stages 2 does not match the 4 stages of --schedule-file " + file);
  GPIPE_EXPECT_THROW_WITH(
      parse_train_config(flags +
                         std::vector<std::string>{"--schedule-file", file, "--schedule", "1f1b"}),
      UsageError, "--schedule-file replaces --schedule and --virtual-stages");
  GPIPE_EXPECT_THROW_WITH(
      parse_train_config(
          flags + std::vector<std::string>{"--schedule-file", file, "--checkpoint", "always"}),
      UsageError,
      "--schedule-file " + file +
          " splits backwards into input and weight gradients, which --checkpoint cannot");
  std::ofstream(dir.file("typo.txt")) << "0F0 0B0\n1F0 1Q0\n";
  GPIPE_EXPECT_THROW_WITH(
      parse_train_config(flags + std::vector<std::string>{"--schedule-file", dir.file("typo.txt")}),
      UsageError, dir.file("typo.txt") + ", line 2: '1Q0' is not an action");
}

// The trace files of two ranks, as their tracers write them: rank 1's tasks start where rank 0's
// end, on the one timeline the ranks share.
std::vector<std::string> rank_traces(const TemporaryDirectory& dir) {
  std::vector<std::string> paths;
  for (int64_t rank = 0; rank < 2; ++rank) {
    std::vector<trace::Event> events;
    for (int64_t step = 0; step < 3; ++step) {
      for (int64_t m = 0; m < 2; ++m) {
        trace::Event e{"forward", rank, rank, m, step};
        e.begin_us = 1000.0 * step + 100.0 * (m + rank);
        e.end_us = e.begin_us + 100;
        e.rank = rank;
        events.push_back(e);
      }
    }
    paths.push_back(dir.file("trace_rank" + std::to_string(rank) + ".json"));
    std::ofstream out(paths.back());
    trace::write_chrome_trace(events, out);
  }
  return paths;
}

TEST(TraceMergeTest, JoinsTheRanksIntoOneTimeline) {
  TemporaryDirectory dir;
  const auto inputs = rank_traces(dir);
  const std::string merged = dir.file("merged.json"), svg = dir.file("merged.svg");
  std::ostringstream said;
  trace_merge(parse_trace_merge_config(
                  {"-o", merged, "--timeline", svg, "--timeline-steps", "1", inputs[1], inputs[0]}),
              said);
  EXPECT_EQ(said.str(),
            merged + ": 12 tasks of 2 ranks from 2 files\n" + svg + ": the last 1 step\n");
  // Every task once, in time order, each in its rank's process; the ranks named.
  const auto events = read_chrome_trace(merged);
  ASSERT_EQ(events.size(), 12u);
  EXPECT_TRUE(std::is_sorted(
      events.begin(), events.end(),
      [](const trace::Event& a, const trace::Event& b) { return a.begin_us < b.begin_us; }));
  for (const auto& e : events) {
    EXPECT_EQ(e.rank, e.worker);
    EXPECT_EQ(e.begin_us, 1000.0 * static_cast<double>(e.step) +
                              100.0 * static_cast<double>(e.microbatch + e.rank));
  }
  std::ifstream in(merged);
  const nlohmann::json json = nlohmann::json::parse(in);
  std::set<std::string> processes;
  for (const auto& e : json.at("traceEvents")) {
    if (e.at("name") == "process_name") processes.insert(e.at("args").at("name"));
  }
  EXPECT_EQ(processes, (std::set<std::string>{"rank 0", "rank 1"}));
  // The timeline draws the last step's 4 tasks, a row per rank.
  tinyxml2::XMLDocument document;
  ASSERT_EQ(document.LoadFile(svg.c_str()), tinyxml2::XML_SUCCESS);
  int boxes = 0;
  std::set<std::string> labels;
  for (auto* e = document.RootElement()->FirstChildElement(); e; e = e->NextSiblingElement()) {
    if (std::string(e->Name()) == "rect" && e->FirstChildElement("title")) ++boxes;
    if (std::string(e->Name()) == "text" && e->GetText()) labels.insert(e->GetText());
  }
  EXPECT_EQ(boxes, 4);
  EXPECT_TRUE(labels.count("rank 0") && labels.count("rank 1"));
  // As a command, too.
  const auto [code, err] = run_command("trace merge -o " + merged + " " + inputs[0]);
  EXPECT_EQ(code, 0) << err;
  EXPECT_EQ(read_chrome_trace(merged).size(), 6u);
}

TEST(TraceMergeTest, BadInputsAreNamedAndNothingIsWritten) {
  TemporaryDirectory dir;
  const auto inputs = rank_traces(dir);
  const std::string merged = dir.file("merged.json");
  const auto merge = [&](std::vector<std::string> args) {
    std::ostringstream said;
    args.insert(args.begin(), {"-o", merged});
    trace_merge(parse_trace_merge_config(args), said);
  };
  GPIPE_EXPECT_THROW_WITH(merge({inputs[0], inputs[1], inputs[0]}), UsageError,
                          "traces '" + inputs[0] + "' and '" + inputs[0] +
                              "' both hold rank 0's tasks: merge the traces of different ranks");
  GPIPE_EXPECT_THROW_WITH(
      merge({dir.file("absent.json")}), UsageError,
      "cannot read trace '" + dir.file("absent.json") + "': No such file or directory");
  const std::string text = write_text(dir.file("text.json"), "forward 0 0\n");
  GPIPE_EXPECT_THROW_WITH(merge({text}), UsageError, "trace '" + text + "' is not JSON: ");
  const std::string other = write_text(dir.file("other.json"), "{\"events\": []}");
  GPIPE_EXPECT_THROW_WITH(merge({other}), UsageError,
                          "trace '" + other + "' has no traceEvents: not a Chrome trace");
  const std::string timeless =
      write_text(dir.file("timeless.json"), R"({"traceEvents": [{"name": "forward", "ph": "X"}]})");
  GPIPE_EXPECT_THROW_WITH(merge({timeless}), UsageError,
                          "trace '" + timeless + "', event 0: no \"ts\"");
  EXPECT_FALSE(fs::exists(merged));
  GPIPE_EXPECT_THROW_WITH(parse_trace_merge_config({"-o", merged}), UsageError,
                          "needs the trace files to merge (TRACE...)");
  GPIPE_EXPECT_THROW_WITH(parse_trace_merge_config({inputs[0], "-o", "/nonexistent/merged.json"}),
                          UsageError, "-o");
}

TEST(TrainRanksTest, EqualsTheThreadRun) {
  TemporaryDirectory dir;
  const auto flags = tiny_model_flags(tiny_corpus(dir)) + std::vector<std::string>{"--steps", "3"};
  // The char GPT ties its embedding and head across the first and last stage (the V: within
  // rank 0); on ranks their copies are summed, on threads each worker's part: the same bits.
  for (const auto& schedule : std::vector<std::vector<std::string>>{
           {"--schedule", "1f1b", "--precision", "bf16", "--clip-grad-norm", "0.5", "--eval-every",
            "2"},
           {"--schedule", "gpipe", "--checkpoint", "except_last"},
           {"--schedule", "interleaved_1f1b", "--virtual-stages", "2", "--chunks", "4"},
           {"--schedule", "zb1p", "--chunks", "6"},
           {"--schedule", "zbv", "--virtual-stages", "2", "--chunks", "4"}}) {
    SCOPED_TRACE(schedule[1]);
    const int64_t stages = schedule[1] == "interleaved_1f1b" || schedule[1] == "zbv" ? 4 : 2;
    std::ostringstream out;
    train(parse_train_config(flags + schedule +
                             std::vector<std::string>{"--stages", std::to_string(stages), "--save",
                                                      dir.file("threads.pt")}),
          out, false);
    const auto [code, output] =
        train_on_ranks(2, flags + schedule +
                              std::vector<std::string>{"--save", dir.file("ranks.pt"), "--trace",
                                                       dir.file("trace.json"), "--timeline",
                                                       dir.file("timeline.svg")});
    ASSERT_EQ(code, 0) << output;
    testing::expect_same_model(dir.file("ranks.pt"), dir.file("threads.pt"));
    // --quiet: nothing printed, on any rank. The trace holds both ranks' tasks.
    EXPECT_EQ(output, "");
    std::ifstream in(dir.file("trace.json"));
    const nlohmann::json trace = nlohmann::json::parse(in);
    std::set<std::pair<int64_t, int64_t>> workers;  // (process, thread): a rank each
    for (const auto& event : trace.at("traceEvents")) {
      if (event.at("ph") == "X") {
        workers.insert({event.at("pid").get<int64_t>(), event.at("tid").get<int64_t>()});
      }
    }
    EXPECT_EQ(workers, (std::set<std::pair<int64_t, int64_t>>{{0, 0}, {1, 1}}));
    tinyxml2::XMLDocument svg;
    EXPECT_EQ(svg.LoadFile(dir.file("timeline.svg").c_str()), tinyxml2::XML_SUCCESS);
  }

  // Without --quiet, rank 0 alone reports: one summary, every stage's peak.
  auto loud = flags;
  loud.erase(std::find(loud.begin(), loud.end(), "--quiet"));
  const auto [code, output] = train_on_ranks(2, loud);
  ASSERT_EQ(code, 0) << output;
  EXPECT_EQ(count(output, "gpipe train: char GPT"), 1) << output;
  EXPECT_EQ(count(output, "2 stages [2,2] on 2 ranks"), 1) << output;
  EXPECT_EQ(count(output, "done: 3 steps"), 1) << output;
  EXPECT_THAT(output, ::testing::HasSubstr("stage 0 "));
  EXPECT_THAT(output, ::testing::HasSubstr(", stage 1 "));
  EXPECT_EQ(count(output, "bubble: "), 1) << output;
}

TEST(TrainRanksTest, StagesMustMatchTheRanks) {
  for (const auto& [flags, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--stages", "3"},
            "gpipe train: --stages 3 does not match 2 ranks x --virtual-stages 1 = 2\n"},
           {{"--devices", "cpu"},
            "gpipe train: --devices names 1 devices for 2 ranks (one per "
            "rank)\n"}}) {
    const auto [code, output] =
        train_on_ranks(2, flags + std::vector<std::string>{"--steps", "1000000", "--quiet"});
    EXPECT_NE(code, 0);
    // Each rank says it.
    EXPECT_EQ(count(output, message), 2) << output;
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Stopped after 3 of 6 steps and resumed from the snapshot, training ends where it ends
// uninterrupted, bit for bit: on threads, and on 2 ranks. A save that a crash cut short (its
// files there, DIR/latest not yet moved) is passed over for the snapshot before.
TEST(TrainSnapshotTest, ResumeEqualsUninterrupted) {
  TemporaryDirectory dir;
  const auto flags = tiny_model_flags(tiny_corpus(dir));
  const auto steps = [](int n) { return std::vector<std::string>{"--steps", std::to_string(n)}; };
  std::ostringstream out;
  train(parse_train_config(flags + steps(6) + std::vector<std::string>{"--save", dir.file("a.pt")}),
        out, false);

  const std::vector<std::string> save = {"--save-every", "3", "--snapshot-dir",
                                         dir.file("threads")};
  const TrainReport first = train(parse_train_config(flags + steps(3) + save), out, false);
  EXPECT_EQ(first.resumed_step, 0);
  EXPECT_EQ(read_file(dir.file("threads/latest")), "step-00000003\n");
  // A crash while saving step 6: its folder and a partial file, DIR/latest unchanged.
  fs::create_directories(dir.file("threads/step-00000006"));
  write_text(dir.file("threads/step-00000006/rank-0.pt.partial"), "cut short");
  const TrainReport resumed = train(
      parse_train_config(flags + steps(6) + save +
                         std::vector<std::string>{"--resume", "--save", dir.file("threads.pt")}),
      out, false);
  EXPECT_EQ(resumed.resumed_step, 3);
  EXPECT_EQ(resumed.losses.size(), 3u);
  testing::expect_same_model(dir.file("threads.pt"), dir.file("a.pt"));

  // On ranks: the uninterrupted run is the threads' (TrainRanksTest).
  const std::vector<std::string> on_ranks = {"--save-every", "3", "--snapshot-dir",
                                             dir.file("ranks")};
  ASSERT_EQ(train_on_ranks(2, flags + steps(3) + on_ranks).first, 0);
  EXPECT_TRUE(fs::exists(dir.file("ranks/step-00000003/rank-1.pt")));
  const auto [code, output] =
      train_on_ranks(2, flags + steps(6) + on_ranks +
                            std::vector<std::string>{"--resume", "--save", dir.file("ranks.pt")});
  ASSERT_EQ(code, 0) << output;
  testing::expect_same_model(dir.file("ranks.pt"), dir.file("a.pt"));

  // --resume without a snapshot starts from the start: one command line for every restart.
  const TrainReport fresh = train(
      parse_train_config(flags + steps(2) +
                         std::vector<std::string>{"--resume", "--snapshot-dir", dir.file("none")}),
      out, false);
  EXPECT_EQ(fresh.resumed_step, 0);
  EXPECT_EQ(fresh.losses.size(), 2u);
}

// fp16's loss scale is part of a snapshot: the tiny model overflows the first scales, and a
// resumed run skips and scales as the uninterrupted one did.
TEST(TrainSnapshotTest, ResumeKeepsTheLossScale) {
  if (!GPIPE_LIBTORCH_2) GTEST_SKIP() << "LibTorch 1.13's CPU autocast has no float16 to scale";
  TemporaryDirectory dir;
  const auto flags = tiny_model_flags(tiny_corpus(dir)) +
                     std::vector<std::string>{"--precision", "fp16", "--loss-scale", "4194304"};
  const auto steps = [](int n) { return std::vector<std::string>{"--steps", std::to_string(n)}; };
  std::ostringstream out;
  const TrainReport whole = train(
      parse_train_config(flags + steps(6) + std::vector<std::string>{"--save", dir.file("a.pt")}),
      out, false);
  EXPECT_GT(whole.skipped_steps, 0);  // 2^22 overflows float16 until the scale backs off
  const std::vector<std::string> save = {"--save-every", "3", "--snapshot-dir", dir.file("ck")};
  train(parse_train_config(flags + steps(3) + save), out, false);
  train(parse_train_config(flags + steps(6) + save +
                           std::vector<std::string>{"--resume", "--save", dir.file("b.pt")}),
        out, false);
  testing::expect_same_model(dir.file("b.pt"), dir.file("a.pt"));
}

// A snapshot of another kind of run is refused, naming each difference, and left as it was.
TEST(TrainSnapshotTest, MismatchIsNamedAndNothingChanges) {
  TemporaryDirectory dir;
  const auto flags = tiny_model_flags(tiny_corpus(dir)) +
                     std::vector<std::string>{"--steps",        "2",           "--save-every", "2",
                                              "--snapshot-dir", dir.file("ck")};
  std::ostringstream out;
  train(parse_train_config(flags), out, false);
  const std::string saved = read_file(dir.file("ck/step-00000002/rank-0.pt"));
  const std::string snapshot = dir.file("ck/step-00000002");
  GPIPE_EXPECT_THROW_WITH(
      train(parse_train_config(flags + std::vector<std::string>{"--resume", "--stages", "3",
                                                                "--schedule", "gpipe"}),
            out, false),
      UsageError,
      "--resume: the snapshot " + snapshot +
          " does not fit this run: balance [2,2], this run [2,1,1]; schedule 1f1b, this run "
          "gpipe; nothing was loaded");
  // Threads' snapshot, ranks' run: each rank says so, exit 2.
  const auto [code, output] = train_on_ranks(2, flags + std::vector<std::string>{"--resume"});
  EXPECT_EQ(code, 1) << output;  // the launcher: a rank failed
  EXPECT_EQ(count(output, "gpipe train: --resume: the snapshot " + snapshot +
                              " does not fit this run: engine threads, this run ranks; world size "
                              "1, this run 2; nothing was loaded\n"),
            2)
      << output;
  EXPECT_EQ(read_file(dir.file("ck/step-00000002/rank-0.pt")), saved);
  EXPECT_EQ(read_file(dir.file("ck/latest")), "step-00000002\n");

  for (const auto& [bad, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--save-every", "2"}, "--save-every needs --snapshot-dir DIR"},
           {{"--resume"}, "--resume needs --snapshot-dir DIR"},
           {{"--snapshot-dir", dir.file("x")}, "--snapshot-dir needs --save-every N or --resume"},
           {{"--save-every", "2", "--snapshot-dir", dir.file("ck/latest")},
            "--snapshot-dir '" + dir.file("ck/latest") + "': "}}) {
    GPIPE_EXPECT_THROW_WITH(parse_train_config(tiny_model_flags(dir.file("corpus.txt")) + bad),
                            UsageError, message);
  }
}

}  // namespace
}  // namespace cli_test
}  // namespace cli
}  // namespace gpipe

// The documents agree with the code: every list of schedules marked in README.md and docs/*.md
// (<!--schedules:RULE-->...<!--/schedules-->) names exactly the kinds RULE allows
// (schedule_kind.h); every row of docs/errors.md is raised here and its message checked; the
// README stays short.
#include "distributed_model.h"
#include "test_util.h"

#include <gpipe/gpipe.h>

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace gpipe {
namespace docs_consistency_test {
namespace {

namespace fs = std::filesystem;
using schedule::ScheduleKind;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<fs::path> documents() {
  std::vector<fs::path> paths{fs::path(GPIPE_SOURCE_DIR) / "README.md"};
  for (const auto& entry : fs::directory_iterator(fs::path(GPIPE_SOURCE_DIR) / "docs")) {
    if (entry.path().extension() == ".md") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The names a document may call a kind by, lower case: the command's, the prose's, the enum's.
std::vector<std::pair<std::string, ScheduleKind>> aliases() {
  std::vector<std::pair<std::string, ScheduleKind>> result;
  const std::map<ScheduleKind, std::vector<std::string>> prose{
      {ScheduleKind::kGPipe, {"gpipe", "kgpipe"}},
      {ScheduleKind::kOneFOneB, {"1f1b", "konefoneb"}},
      {ScheduleKind::kInterleavedOneFOneB, {"interleaved 1f1b", "kinterleavedonefoneb"}},
      {ScheduleKind::kZeroBubble, {"zb1p", "kzerobubble"}},
      {ScheduleKind::kZeroBubbleV, {"zbv", "kzerobubblev"}},
      {ScheduleKind::kInterleavedZeroBubble, {"interleaved zb1p", "kinterleavedzerobubble"}},
      {ScheduleKind::kLoopedBFS, {"looped bfs", "kloopedbfs"}},
      {ScheduleKind::kDualPipeV, {"dualpipev", "kdualpipev"}},
      {ScheduleKind::kVMin, {"v-min", "kvmin"}},
      {ScheduleKind::kVHalf, {"v-half", "kvhalf"}}};
  for (const auto kind : schedule::all_schedule_kinds()) {
    result.emplace_back(c10::str(kind), kind);
    for (const auto& name : prose.at(kind)) result.emplace_back(name, kind);
  }
  // Longest first: "interleaved_zb1p" before "zb1p".
  std::sort(result.begin(), result.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return result;
}

// The kinds `text` names, each once; sets `unknown` to what is left between them that is not
// punctuation, "and", "or" or a space.
std::set<ScheduleKind> kinds_named(const std::string& text, std::string* unknown) {
  // Lines wrap inside names ("looped\n  BFS"): one space for every run of white space.
  std::string t;
  for (const char c : lower(text)) {
    const bool space = std::isspace(static_cast<unsigned char>(c));
    if (!space || t.empty() || t.back() != ' ') t += space ? ' ' : c;
  }
  const auto names = aliases();
  std::set<ScheduleKind> kinds;
  for (size_t at = 0; at < t.size();) {
    bool matched = false;
    for (const auto& [name, kind] : names) {
      if (t.compare(at, name.size(), name) == 0) {
        kinds.insert(kind);
        at += name.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (t.compare(at, 3, "and") == 0) {
      at += 3;
    } else if (t.compare(at, 2, "or") == 0) {
      at += 2;
    } else {
      if (!std::isspace(static_cast<unsigned char>(t[at])) &&
          std::string(",|`").find(t[at]) == std::string::npos) {
        *unknown += t[at];
      }
      ++at;
    }
  }
  return kinds;
}

// The rules a marked list may follow.
std::map<std::string, std::function<bool(ScheduleKind)>> rules() {
  using schedule::Placement;
  return {
      {"all", [](ScheduleKind) { return true; }},
      {"loops_stages", schedule::loops_stages},
      {"v_placement", [](ScheduleKind k) { return schedule::placement_of(k) == Placement::kV; }},
      {"several_stages_per_worker",
       [](ScheduleKind k) {
         return schedule::loops_stages(k) || schedule::placement_of(k) == Placement::kV;
       }},
      {"splits_backward", [](ScheduleKind k) { return schedule::splits_backward(k); }},
      {"checkpoints", [](ScheduleKind k) { return !schedule::splits_backward(k); }},
      {"needs_a_microbatch_per_stage",
       [](ScheduleKind k) { return schedule::min_microbatches(k, 4) == 4; }},
  };
}

TEST(DocsConsistencyTest, ScheduleListsMatchTheRules) {
  const std::string open = "<!--schedules:";
  const std::string close = "<!--/schedules-->";
  int lists = 0;
  for (const auto& path : documents()) {
    const std::string text = read_file(path);
    for (size_t at = text.find(open); at != std::string::npos; at = text.find(open, at + 1)) {
      const size_t name_end = text.find("-->", at);
      const size_t end = text.find(close, at);
      ASSERT_TRUE(name_end != std::string::npos && end != std::string::npos)
          << path << ": an unclosed schedule list";
      const std::string rule = text.substr(at + open.size(), name_end - at - open.size());
      const std::string list = text.substr(name_end + 3, end - name_end - 3);
      SCOPED_TRACE(path.filename().string() + ": " + rule + ": " + list);
      ASSERT_TRUE(rules().count(rule)) << "no rule named '" << rule << "'";
      std::string unknown;
      const auto named = kinds_named(list, &unknown);
      EXPECT_EQ(unknown, "") << "words that name no schedule";
      const auto expected = schedule::schedule_kinds_where(rules().at(rule));
      EXPECT_EQ(named, std::set<ScheduleKind>(expected.begin(), expected.end()))
          << "the rule allows " << schedule::schedule_name_list(expected);
      ++lists;
    }
  }
  // The lists of the README, glossary, cli, distributed and troubleshooting pages.
  EXPECT_GE(lists, 8);
}

TEST(DocsConsistencyTest, ReadmeIsShort) {
  const std::string readme = read_file(fs::path(GPIPE_SOURCE_DIR) / "README.md");
  EXPECT_LE(std::count(readme.begin(), readme.end(), '\n'), 200);
}

// ---- docs/design.md: the layout ----

// The files below `folder` of the source tree whose names end with one of `endings`, as paths
// relative to the source tree.
std::set<std::string> files_below(const std::string& folder,
                                  const std::vector<std::string>& endings) {
  std::set<std::string> found;
  const fs::path root(GPIPE_SOURCE_DIR);
  for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
    const std::string name = entry.path().filename().string();
    for (const auto& ending : endings) {
      if (entry.is_regular_file() && name.size() > ending.size() &&
          name.compare(name.size() - ending.size(), ending.size(), ending) == 0) {
        found.insert(fs::relative(entry.path(), root).generic_string());
      }
    }
  }
  return found;
}

// Every `gpipe/....h` named between <!--public-headers--> and <!--/public-headers--> of
// docs/design.md: what the installed package holds.
TEST(DocsConsistencyTest, PublicHeadersAreTheListInDesign) {
  const std::string text = read_file(fs::path(GPIPE_SOURCE_DIR) / "docs" / "design.md");
  const size_t begin = text.find("<!--public-headers-->");
  const size_t end = text.find("<!--/public-headers-->");
  ASSERT_TRUE(begin != std::string::npos && end != std::string::npos && begin < end)
      << "docs/design.md has no <!--public-headers--> list";
  std::set<std::string> listed;
  const std::string list = text.substr(begin, end - begin);
  for (size_t at = list.find("`gpipe/"); at != std::string::npos; at = list.find("`gpipe/", at)) {
    const size_t close = list.find('`', at + 1);
    ASSERT_NE(close, std::string::npos);
    listed.insert("include/" + list.substr(at + 1, close - at - 1));
    at = close + 1;
  }
  EXPECT_EQ(listed, files_below("include", {".h"}));
}

// The rules of docs/design.md's layout: no source over 450 lines, and a header of the library's
// internals included by its path from src/ ("detail/copy.h"), never by its bare name.
TEST(DocsConsistencyTest, SourcesKeepTheLayoutRules) {
  std::set<std::string> sources;
  for (const char* folder : {"src", "include", "tools"}) {
    const auto found = files_below(folder, {".h", ".cpp"});
    sources.insert(found.begin(), found.end());
  }
  ASSERT_GT(sources.size(), 100u);
  for (const auto& source : sources) {
    const std::string text = read_file(fs::path(GPIPE_SOURCE_DIR) / source);
    EXPECT_LE(std::count(text.begin(), text.end(), '\n'), 450) << source;
    if (source.rfind("src/", 0) != 0) continue;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("#include \"", 0) != 0) continue;
      EXPECT_NE(line.find('/'), std::string::npos) << source << ": " << line;
    }
  }
}

// ---- docs/errors.md ----

struct Documented {
  std::string kind;     // e.g. "c10::ValueError"
  std::string message;  // with "..." where it varies
};

// Each table row of docs/errors.md: input -> (error kind, message).
std::map<std::string, Documented> documented_errors() {
  std::map<std::string, Documented> rows;
  std::istringstream in(read_file(fs::path(GPIPE_SOURCE_DIR) / "docs" / "errors.md"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| ", 0) != 0 || line == "| input | error | message |") continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(2));
    for (std::string cell; std::getline(row, cell, '|');) {
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      if (cell.size() >= 2 && cell.front() == '`' && cell.back() == '`') {
        cell = cell.substr(1, cell.size() - 2);
      }
      cells.push_back(cell);
    }
    if (cells.size() >= 3) rows[cells[0]] = {cells[1], cells[2]};
  }
  return rows;
}

// Whether `message` holds the documented one's parts, in order.
bool matches(const std::string& message, const std::string& documented) {
  size_t at = 0;
  std::string rest = documented;
  while (true) {
    const size_t dots = rest.find("...");
    const std::string part = rest.substr(0, dots);
    const std::string trimmed = part.substr(0, part.find_last_not_of(' ') + 1);
    if (!trimmed.empty()) {
      const size_t found = message.find(trimmed.substr(trimmed.find_first_not_of(' ')), at);
      if (found == std::string::npos) return false;
      at = found + trimmed.size();
    }
    if (dots == std::string::npos) return true;
    rest = rest.substr(dots + 3);
  }
}

// A layer that stashes or pops by name; "bar" undeclared.
struct SkipLayerImpl : torch::nn::Module, skip::Skippable {
  SkipLayerImpl(std::vector<std::string> stash, std::vector<std::string> pop, bool act = true)
      : Skippable(stash, pop), stashes(stash), pops(pop), act(act) {}
  torch::Tensor forward(torch::Tensor x) {
    if (!act) return x;
    for (const auto& name : stashes) stash(name, x);
    for (const auto& name : pops) x = x + pop(name);
    return x;
  }
  std::vector<std::string> stashes, pops;
  bool act;
};
TORCH_MODULE(SkipLayer);

SkipLayer stashing(const std::string& name, bool act = true) {
  return SkipLayer(std::vector<std::string>{name}, std::vector<std::string>{}, act);
}
SkipLayer popping(const std::string& name) {
  return SkipLayer(std::vector<std::string>{}, std::vector<std::string>{name});
}

struct UndeclaredStashImpl : torch::nn::Module, skip::Skippable {
  UndeclaredStashImpl() : Skippable({"foo"}, {}) {}
  torch::Tensor forward(torch::Tensor x) {
    stash("bar", x);
    return x;
  }
};
TORCH_MODULE(UndeclaredStash);

struct NonTensorImpl : torch::nn::Module {
  double forward(torch::Tensor x) { return 1.0; }
};
TORCH_MODULE(NonTensor);

at::Tensor mse(const Batch& y, const Batch& t) { return torch::mse_loss(y.tensor(), t.tensor()); }

torch::nn::Sequential linears(int n) {
  torch::nn::Sequential model;
  for (int k = 0; k < n; ++k) model->push_back(torch::nn::Linear(2, 2));
  return model;
}

// Sets the environment of rank 0 of 2 for a scope (PipelineStage checks its layout before any
// other rank is needed).
struct TwoRanks {
  explicit TwoRanks(bool world_size = true) {
    setenv("RANK", "0", 1);
    if (world_size) setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "1", 1);
  }
  ~TwoRanks() {
    for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(name);
  }
};

// What raises each documented error.
std::map<std::string, std::function<void()>> raisers() {
  using namespace gpipe::schedule;
  const auto schedule_of = [](ScheduleKind kind, int64_t per_worker = 1) {
    return PipelineScheduleOptions(4).schedule(kind).stages_per_worker(per_worker);
  };
  return {
      {"sum of balance != layers", [] { GPipe(linears(2), GPipeOptions({1})); }},
      {"a balance entry <= 0",
       [] {
         GPipe(linears(2), GPipeOptions({0, 2}));
       }},
      {"chunks <= 0", [] { GPipe(linears(1), GPipeOptions({1}).chunks(0)); }},
      {"an unknown checkpoint mode's name", [] { parse_checkpoint_mode("x"); }},
      {"the same child twice",
       [] {
         torch::nn::Linear linear(2, 2);
         GPipe(torch::nn::Sequential(linear, linear), GPipeOptions({1, 1}));
       }},
      {"one parameter in two children",
       [] {
         torch::nn::Linear a(2, 2), b(2, 2);
         b->register_parameter("shared", a->weight);
         GPipe(torch::nn::Sequential(a, b), GPipeOptions({1, 1}));
       }},
      {"too few devices",
       [] {
         GPipe(linears(2), GPipeOptions({1, 1}).devices({c10::Device(c10::kCPU)}));
       }},
      {"a layer returns neither Tensor nor `std::vector<Tensor>`",
       [] {
         GPipe(torch::nn::Sequential(NonTensor()), GPipeOptions({1}))->forward(torch::ones({1}));
       }},
      {"list inputs with different batch sizes",
       [] {
         GPipe(linears(1), GPipeOptions({1}))
             ->forward<std::vector<torch::Tensor>>(
                 std::vector<torch::Tensor>{torch::ones({10, 2}), torch::ones({7, 2})});
       }},
      {"a 0-dimensional input",
       [] { GPipe(linears(1), GPipeOptions({1}))->forward(torch::ones({})); }},
      {"an undefined input",
       [] { GPipe(linears(1), GPipeOptions({1}))->forward(torch::Tensor()); }},
      {"to(device)", [] { GPipe(linears(1), GPipeOptions({1}))->to(c10::Device(c10::kCPU)); }},
      {"stashes and pops that do not pair up",
       [] { skip::verify_skippables(torch::nn::Sequential(stashing("foo"))); }},
      {"a stash of an undeclared name",
       [] {
         skip::UseSkipTracker use(std::make_shared<skip::SkipTracker>());
         UndeclaredStash()->forward(torch::ones({2, 2}));
       }},
      {"a pop before its stash",
       [] {
         skip::UseSkipTracker use(std::make_shared<skip::SkipTracker>());
         popping("foo")->forward(torch::ones({2, 2}));
       }},
      {"a declared stash that a layer does not make (GPipe)",
       [] {
         GPipe(torch::nn::Sequential(stashing("foo", /*act=*/false), popping("foo")),
               GPipeOptions({1, 1}))
             ->forward(torch::ones({2, 2}));
       }},
      {"no stages", [] { PipelineSchedule({}, mse, PipelineScheduleOptions(4)); }},
      {"chunks <= 0 in the schedule engines",
       [] {
         PipelineSchedule(linears(2), {1, 1}, mse, PipelineScheduleOptions(0));
       }},
      {"several stages per worker for a schedule of one",
       [=] {
         PipelineSchedule(linears(4), {1, 1, 1, 1}, mse, schedule_of(ScheduleKind::kOneFOneB, 2));
       }},
      {"checkpointing with a schedule that splits backwards",
       [=] {
         PipelineSchedule(
             linears(2), {1, 1}, mse,
             schedule_of(ScheduleKind::kZeroBubble).checkpoint(CheckpointMode::kAlways));
       }},
      {"fewer micro-batches than DualPipeV needs",
       [=] {
         PipelineSchedule pipe(linears(4), {1, 1, 1, 1}, mse,
                               schedule_of(ScheduleKind::kDualPipeV, 2));
         pipe.step(torch::ones({2, 2}), torch::ones({2, 2}));
       }},
      {"input and target of different batch sizes",
       [] {
         PipelineSchedule(linears(2), {1, 1}, mse, PipelineScheduleOptions(2))
             .step(torch::ones({4, 2}), torch::ones({3, 2}));
       }},
      {"a loss function that returns no scalar",
       [] {
         PipelineSchedule(
             linears(2), {1, 1}, [](const Batch& y, const Batch&) { return y.tensor().sum(0); },
             PipelineScheduleOptions(1))
             .step(torch::ones({4, 2}), torch::ones({4, 2}));
       }},
      {"step() under no-grad or inference mode",
       [] {
         PipelineSchedule pipe(linears(2), {1, 1}, mse, PipelineScheduleOptions(2));
         torch::NoGradGuard no_grad;
         pipe.step(torch::ones({4, 2}), torch::ones({4, 2}));
       }},
      {"a tied parameter's stages on different devices",
       [] {
         PipelineSchedule(testing::tied_model(), testing::distributed_balance(2), mse,
                          PipelineScheduleOptions(4).devices(
                              {c10::Device(c10::kCPU), c10::Device(c10::kCUDA, 0)}));
       }},
      {"a negative max_norm",
       [] {
         PipelineSchedule(linears(2), {1, 1}, mse, PipelineScheduleOptions(2)).clip_grad_norm(-1);
       }},
      {"a balance of other than WORLD_SIZE x stages_per_worker stages",
       [] {
         TwoRanks ranks;
         distributed::PipelineStage(linears(3), {1, 1, 1}, mse,
                                    distributed::PipelineStageOptions(4));
       }},
      {"WORLD_SIZE not set for a PipelineStage",
       [] {
         TwoRanks ranks(/*world_size=*/false);
         distributed::PipelineStage(linears(2), {1, 1}, mse, distributed::PipelineStageOptions(4));
       }},
      {"autocast on a device type but CPU and CUDA", [] { amp::Autocast(torch::kMeta); }},
      {"a GradScaler option out of range",
       [] { amp::GradScaler(amp::GradScalerOptions().growth_factor(1)); }},
      {"unscaling float16 gradients",
       [] {
         auto p = torch::zeros({2}, torch::TensorOptions().dtype(torch::kHalf).requires_grad(true));
         p.mutable_grad() = torch::ones({2}, torch::kHalf);
         amp::GradScaler().unscale({p});
       }},
  };
}

// The error's kind, most derived first.
std::string kind_of(const std::function<void()>& raise, std::string* message) {
  try {
    raise();
  } catch (const c10::ValueError& e) {
    *message = e.what_without_backtrace();
    return "c10::ValueError";
  } catch (const c10::IndexError& e) {
    *message = e.what_without_backtrace();
    return "c10::IndexError";
  } catch (const c10::TypeError& e) {
    *message = e.what_without_backtrace();
    return "c10::TypeError";
  } catch (const c10::Error& e) {
    *message = e.what_without_backtrace();
    return "c10::Error";
  }
  return "nothing";
}

TEST(DocsConsistencyTest, ErrorsPageMatchesTheCode) {
  const auto rows = documented_errors();
  const auto raise = raisers();
  ASSERT_GE(rows.size(), 30u);
  for (const auto& [input, documented] : rows) {
    SCOPED_TRACE(input);
    ASSERT_TRUE(raise.count(input)) << "docs/errors.md has a row this test does not raise";
    std::string message;
    EXPECT_EQ(kind_of(raise.at(input), &message), documented.kind);
    EXPECT_TRUE(matches(message, documented.message))
        << "documented: " << documented.message << "\nraised: " << message;
  }
  for (const auto& [input, _] : raise) {
    EXPECT_TRUE(rows.count(input)) << "no row of docs/errors.md for '" << input << "'";
  }
}

}  // namespace
}  // namespace docs_consistency_test
}  // namespace gpipe

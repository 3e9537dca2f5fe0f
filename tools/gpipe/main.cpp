// The `gpipe` command: `gpipe train` (the default job), `gpipe plan`, `gpipe generate`,
// `gpipe launch`, `gpipe trace merge`.
//
// Exit codes: 0 done, 1 a failure while running, 2 a bad command line (one line on stderr).
#include "arguments.h"
#include "generate.h"
#include "launcher.h"
#include "trace_merge.h"
#include "train.h"
#include "train_plan.h"
#include "train_simulate.h"

#include "gpipe/cpu_malloc.h"

#include <c10/util/Exception.h>

#include <unistd.h>

#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage = R"(usage: gpipe <command> [flags]

commands:
  train       train a character-level GPT pipelined over stages (the default job)
  plan        choose the schedule, stages, micro-batches, checkpointing and balance of train:
              gpipe train --plan show (train's flags)
  generate    sample text from a model saved by train --save
  launch      start the N ranks of a multi-process program on this machine:
              gpipe launch -n N [--master-port P] [--grace S] -- program [args...]
  trace merge join the ranks' trace files into one timeline:
              gpipe trace merge -o FILE [--timeline SVG] TRACE...

`gpipe <command> --help` lists a command's flags.
)";

int run(const std::string& command, const std::vector<std::string>& args) {
  using namespace gpipe::cli;
  const bool help = asks_for_help(args);
  if (command == "train" || command == "plan") {
    if (help) return std::cout << train_usage(), 0;
    std::vector<std::string> flags = args;
    if (command == "plan") flags.insert(flags.end(), {"--plan", "show"});
    TrainConfig config = parse_train_config(flags);
    if (config.simulate) return simulate_schedules(config, std::cout), 0;
    // On ranks the plan travels through the group's store, and training goes on in the group.
    std::optional<gpipe::distributed::ProcessGroup> ranks;
    if (config.ranks && config.plan != "none") ranks = meet_ranks(config);
    const gpipe::distributed::ProcessGroup* group = ranks ? &*ranks : nullptr;
    if (config.plan == "show") return plan_training(config, std::cout, group), 0;
    if (config.plan == "auto") config = with_plan(config, plan_training(config, std::cout, group));
    std::ostringstream discarded;
    train(config, config.quiet ? static_cast<std::ostream&>(discarded) : std::cout,
          !config.quiet && isatty(STDOUT_FILENO), group);
    return 0;
  }
  if (command == "generate") {
    if (help) return std::cout << generate_usage(), 0;
    generate(parse_generate_config(args), std::cout);
    return 0;
  }
  if (command == "launch") return gpipe::launcher::launch(args, "gpipe launch");
  if (command == "trace") {
    if (args.empty() || args[0] != "merge") {
      if (help) return std::cout << trace_merge_usage(), 0;
      throw UsageError(args.empty()
                           ? "needs a trace command (trace commands: merge)"
                           : "unknown trace command '" + args[0] + "' (trace commands: merge)");
    }
    if (help) return std::cout << trace_merge_usage(), 0;
    trace_merge(parse_trace_merge_config(std::vector<std::string>(args.begin() + 1, args.end())),
                std::cout);
    return 0;
  }
  if (command == "--help" || command == "-h" || command == "help") return std::cout << kUsage, 0;
  throw UsageError("unknown command '" + command +
                   "' (commands: train, plan, generate, launch, trace)");
}

}  // namespace

int main(int argc, char** argv) {
  // Pipeline workers would otherwise fault their freed activations' pages in again every step.
  gpipe::memory::reuse_freed_cpu_memory();
  const std::vector<std::string> words(argv + 1, argv + argc);
  if (words.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  // One write per line: the ranks of a job share stderr, and their lines must not mix.
  const bool trace_merge = words[0] == "trace" && words.size() > 1 && words[1] == "merge";
  const auto fail = [&](const std::string& message, int code) {
    std::cerr << "gpipe " + words[0] + (trace_merge ? " merge" : "") + ": " + message + "\n";
    return code;
  };
  try {
    return run(words[0], std::vector<std::string>(words.begin() + 1, words.end()));
  } catch (const gpipe::cli::UsageError& error) {
    return fail(error.what(), 2);
  } catch (const c10::Error& error) {
    return fail(error.what_without_backtrace(), 1);
  } catch (const std::exception& error) {
    return fail(error.what(), 1);
  }
}

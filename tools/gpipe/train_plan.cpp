#include "train_plan.h"

#include "text_corpus.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

namespace gpipe {
namespace cli {

namespace {

// The choice as rank 0 sends it to the others: "ok <schedule> <stages per worker>
// <micro-batches> <checkpoint> <layers per stage>...", or "error <what rank 0 threw>".
std::string encode(const Plan& plan) {
  std::ostringstream out;
  out << "ok " << static_cast<int>(plan.schedule) << " " << plan.stages_per_worker << " "
      << plan.microbatches << " " << static_cast<int>(plan.checkpoint);
  for (const int64_t b : plan.balance) out << " " << b;
  return out.str();
}

Plan decode(const std::string& text) {
  std::istringstream in(text);
  std::string status;
  in >> status;
  if (status != "ok") {
    TORCH_CHECK(false, "rank 0 could not plan:", text.substr(std::min(text.size(), status.size())));
  }
  Plan plan;
  int schedule = 0, checkpoint = 0;
  in >> schedule >> plan.stages_per_worker >> plan.microbatches >> checkpoint;
  plan.schedule = static_cast<schedule::ScheduleKind>(schedule);
  plan.checkpoint = static_cast<CheckpointMode>(checkpoint);
  for (int64_t b = 0; in >> b;) plan.balance.push_back(b);
  return plan;
}

// Rank 0's plan, for every rank.
constexpr const char* kPlanKey = "plan";

Plan plan_here(const TrainConfig& c, std::ostream& out) {
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  models::CharGPTOptions options;
  const torch::nn::Sequential model = make_model(c, options);
  const TextCorpus corpus = TextCorpus::load(c.data, options.block_size() + 1);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.seed) + 1);
  const auto [input, target] = corpus.batch(c.batch_size, options.block_size(), generator);

  const int64_t workers = c.stages / c.virtual_stages;
  at::set_num_threads(static_cast<int>(c.threads));  // as each worker will run
  const PlanReport report = plan(
      model, input, target,
      [](const Batch& output, const Batch& target) {
        return models::char_gpt_loss(output.tensor(), target.tensor());
      },
      PlanOptions(workers)
          .memory_cap(static_cast<int64_t>(c.memory_budget_mib * 1048576.0))
          .param_scale(4.0)  // weights, gradients and AdamW's two moments
          .ranks(c.ranks.has_value())
          .receive_window(c.receive_window));
  out << "gpipe train --plan: " << workers
      << (c.ranks ? " ranks, planned as worker threads of rank 0" : " worker threads") << ", batch "
      << c.batch_size
      << (c.memory_budget_mib > 0 ? c10::str(", at most ", c.memory_budget_mib, " MiB a worker")
                                  : std::string())
      << ", " << describe_model(model, options, c.load) << "\n"
      << report;
  const Plan& best = report.best();
  out << "choice: " << best.family() << ", balance";
  for (const auto b : best.balance) out << " " << b;
  out << "\n";
  return best;
}

}  // namespace

Plan plan_training(const TrainConfig& c, std::ostream& out,
                   const distributed::ProcessGroup* ranks) {
  if (!c.ranks) return plan_here(c, out);
  TORCH_INTERNAL_ASSERT(ranks, "plan_training on ranks without their group");
  if (ranks->rank() != 0) {
    const std::vector<uint8_t> bytes = ranks->store->get(kPlanKey);
    return decode(std::string(bytes.begin(), bytes.end()));
  }
  std::string message;
  try {
    const Plan best = plan_here(c, out);
    message = encode(best);
    ranks->store->set(kPlanKey, std::vector<uint8_t>(message.begin(), message.end()));
    return best;
  } catch (const std::exception& error) {
    // The others would wait for a choice until their timeout: tell them there is none.
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    message =
        std::string("error ") + (c10_error ? c10_error->what_without_backtrace() : error.what());
    ranks->store->set(kPlanKey, std::vector<uint8_t>(message.begin(), message.end()));
    throw;
  }
}

TrainConfig with_plan(TrainConfig c, const Plan& plan) {
  c.schedule = c10::str(plan.schedule);
  c.virtual_stages = plan.stages_per_worker;
  c.stages = static_cast<int64_t>(plan.balance.size());
  c.chunks = plan.microbatches;
  c.checkpoint = plan.checkpoint;
  c.balance = plan.balance;
  return c;
}

}  // namespace cli
}  // namespace gpipe

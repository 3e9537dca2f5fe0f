#include "train_plan.h"

#include "text_corpus.h"

#include <gpipe/distributed/share_plans.h>

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace gpipe {
namespace cli {

namespace {

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
          .receive_window(c.receive_window)
          .intra_op_threads(c.threads));
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
  return distributed::share_plans(*ranks, [&] { return std::vector<Plan>{plan_here(c, out)}; })
      .front();
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

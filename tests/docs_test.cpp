// The C++ snippets of README.md and docs/*.md, word for word: compiled here, and run where one
// process can run them. tests/docs_code_blocks.cmake fails for a snippet that is not here (or in
// examples/ or a public header), so the docs cannot drift from code that builds.
#include "test_util.h"

#include <gpipe/gpipe.h>

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

namespace gpipe {
namespace docs_test {
namespace {

// clang-format off
// docs/module.md, "Skip connections".
struct StashImpl : torch::nn::Module, gpipe::skip::Skippable {
  StashImpl() : Skippable(/*stash=*/{"1to3"}, /*pop=*/{}) {}
  torch::Tensor forward(torch::Tensor x) {
    stash("1to3", x);
    return x;
  }
};
TORCH_MODULE(Stash);

struct AddImpl : torch::nn::Module, gpipe::skip::Skippable {
  AddImpl() : Skippable(/*stash=*/{}, /*pop=*/{"1to3"}) {}
  torch::Tensor forward(torch::Tensor x) { return x + pop("1to3"); }
};
TORCH_MODULE(Add);

// docs/checkpointing.md, "What checkpointing requires of a layer".
struct CountingImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    if (!gpipe::is_recomputing()) ++calls;  // once per micro-batch, not again in backward
    return x;
  }
  int64_t calls = 0;
};
TORCH_MODULE(Counting);

// docs/training.md, "Tied weights".
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(torch::Tensor weight) : weight(register_parameter("weight", weight)) {}
  torch::Tensor forward(torch::Tensor x) { return torch::matmul(x, weight.t()); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedHead);
// clang-format on

// docs/training.md: a tied model trained under autocast with a grad scaler, clipped and
// evaluated; the scaler never overflows in bfloat16 and the loss falls.
TEST(DocsTest, TrainingRecipesSnippets) {
  torch::manual_seed(0);
  // clang-format off
  torch::nn::Embedding embedding(/*vocabulary=*/256, /*width=*/64);
  torch::nn::Sequential model(embedding, torch::nn::Linear(64, 64), torch::nn::Tanh(),
                              TiedHead(embedding->weight));  // the same tensor: tied
  // clang-format on
  const schedule::LossFunction mse = [](const Batch& output, const Batch& target) {
    return torch::mse_loss(output.tensor(), target.tensor());
  };
  const torch::Tensor input = torch::randint(256, {32}, torch::kLong);
  const torch::Tensor target = torch::randn({32, 256}) * 0.1;
  const torch::Tensor held_out_input = input, held_out_target = target;
  const double before = torch::mse_loss(model->forward(input), target).item<double>();
  // clang-format off
  auto scaler = std::make_shared<gpipe::amp::GradScaler>();  // for float16; bfloat16 needs none
  gpipe::schedule::PipelineSchedule pipe(
      model, /*balance=*/{2, 2}, mse,
      gpipe::schedule::PipelineScheduleOptions(/*chunks=*/4).grad_scaler(scaler));
  torch::optim::AdamW optimizer(pipe.parameters(), /*lr=*/1e-3);  // each parameter once
  for (int step = 0; step < 10; ++step) {
    optimizer.zero_grad();
    {
      gpipe::amp::Autocast autocast(torch::kCPU, torch::kBFloat16);
      pipe.step(input, target);  // forwards under autocast, backwards outside it
    }
    pipe.clip_grad_norm(/*max_norm=*/1.0);  // over the whole model
    scaler->step(optimizer);                // skipped on every rank if any overflowed
    scaler->update();
  }
  model->eval();  // dropout off, batch norm's running statistics
  gpipe::schedule::Evaluation validation = pipe.evaluate(held_out_input, held_out_target);
  // clang-format on
  EXPECT_EQ(pipe.parameters().size(), model->parameters().size() - 1);
  EXPECT_EQ(scaler->growth_tracker(), 10);
  EXPECT_LT(validation.loss.item<double>(), before);
}

TEST(DocsTest, SkipConnectionSnippet) {
  torch::manual_seed(0);
  // clang-format off
  torch::nn::Sequential model(Stash(), torch::nn::Linear(8, 8), Add());
  gpipe::GPipe pipe(model, gpipe::GPipeOptions({1, 2}).chunks(4));
  // clang-format on
  const torch::Tensor x = torch::randn({8, 8});
  auto* linear = model[1]->as<torch::nn::Linear>();
  EXPECT_TRUE(torch::allclose(pipe->forward(x), linear->forward(x) + x));
}

// The schedule snippets' model (8 x Linear(4, 4)) and batch, and the plain model's loss on it.
struct ScheduleSnippetProblem {
  torch::nn::Sequential sequential;
  torch::Tensor input, target, expected;
};

ScheduleSnippetProblem schedule_snippet_problem() {
  torch::manual_seed(0);
  torch::nn::Sequential sequential;
  for (int k = 0; k < 8; ++k) sequential->push_back(torch::nn::Linear(4, 4));
  const torch::Tensor input = torch::randn({16, 4});
  const torch::Tensor target = torch::randn({16, 4});
  return {sequential, input, target, torch::mse_loss(sequential->forward(input), target)};
}

TEST(DocsTest, ExplicitScheduleSnippet) {
  auto [sequential, input, target, expected] = schedule_snippet_problem();
  // clang-format off
  namespace gs = gpipe::schedule;
  gs::LossFunction mse = [](const gpipe::Batch& output, const gpipe::Batch& target) {
    return torch::mse_loss(output.tensor(), target.tensor());
  };
  gs::PipelineSchedule pipe(sequential, /*balance=*/{4, 4}, mse,
                            gs::PipelineScheduleOptions(/*chunks=*/8)
                                .schedule(gs::ScheduleKind::kOneFOneB));
  torch::Tensor loss = pipe.step(input, target);  // gradients as from one full-batch backward
  // clang-format on
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-5);
}

// Run in the test's folder, where it writes zbv.txt first.
TEST(DocsTest, CustomScheduleSnippet) {
  auto [sequential, input, target, expected] = schedule_snippet_problem();
  std::ofstream("zbv.txt") << schedule::write_schedule(schedule::zbv_schedule(2, 8));
  namespace gs = gpipe::schedule;
  const gs::LossFunction mse = [](const gpipe::Batch& output, const gpipe::Batch& target) {
    return torch::mse_loss(output.tensor(), target.tensor());
  };
  // clang-format off
  gs::PipelineSchedule pipe(sequential, /*balance=*/{2, 2, 2, 2}, mse,
                            gs::PipelineScheduleOptions(/*chunks=*/8)
                                .custom_schedule(gs::read_schedule_file("zbv.txt")));
  // clang-format on
  std::remove("zbv.txt");
  EXPECT_EQ(pipe.num_workers(), 2);
  EXPECT_NEAR(pipe.step(input, target).item<double>(), expected.item<double>(), 1e-5);
}

// Compiled, not run: it needs the ranks of a job (examples/distributed_train.cpp runs the same
// under the launcher and torchrun).
// docs/gpu.md: compiled; it runs where two GPUs are.
[[maybe_unused]] torch::Tensor gpu_snippet(torch::nn::Sequential sequential, torch::Tensor input) {
  // clang-format off
  gpipe::GPipe model(sequential, gpipe::GPipeOptions({4, 3})
                                     .devices({torch::Device(torch::kCUDA, 0),
                                               torch::Device(torch::kCUDA, 1)})
                                     .chunks(8));
  torch::Tensor output = model->forward(input);  // on cuda:1
  // clang-format on
  return output;
}

[[maybe_unused]] void distributed_snippet(torch::nn::Sequential model, schedule::LossFunction mse,
                                          torch::Tensor input, torch::Tensor target) {
  // clang-format off
  namespace gd = gpipe::distributed;
  torch::manual_seed(0);  // the same model on every rank
  gd::PipelineStage pipe(model, /*balance=*/{2, 3}, mse,
                         gd::PipelineStageOptions(/*chunks=*/4).schedule(
                             gpipe::schedule::ScheduleKind::kOneFOneB));
  torch::optim::SGD optimizer(pipe.parameters(), /*lr=*/0.05);  // this rank's, each once
  optimizer.zero_grad();
  torch::Tensor loss = pipe.step(input, target);  // the same batch on every rank; loss on every rank
  optimizer.step();
  // clang-format on
}

// Compiled, not run: profiling on a 128 x 3 x 224 x 224 sample takes a while (BalanceTest times
// balance_by_time on small models).
[[maybe_unused]] void balancing_snippet(torch::nn::Sequential sequential) {
  // clang-format off
  auto sample = torch::randn({128, 3, 224, 224});
  auto balance = gpipe::balance::balance_by_time(4, sequential, sample);
  gpipe::GPipe model(sequential, gpipe::GPipeOptions(balance).chunks(8));
  // clang-format on
}

// Counts every call, recomputations too.
struct EveryCallImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    ++calls;
    return x;
  }
  int64_t calls = 0;
};
TORCH_MODULE(EveryCall);

TEST(DocsTest, CheckpointingSnippetCountsEachMicroBatchOnce) {
  Counting counting;
  EveryCall every_call;
  torch::nn::Sequential sequential(counting, every_call, torch::nn::Linear(4, 4));
  GPipe pipe(sequential, GPipeOptions({2, 1}).chunks(4).checkpoint(CheckpointMode::kAlways));
  pipe->forward(torch::randn({8, 4}, torch::requires_grad())).sum().backward();
  EXPECT_EQ(every_call->calls, 8);  // 4 micro-batches, each recomputed
  EXPECT_EQ(counting->calls, 4);
}

// docs/planning.md: the planner's choice, trained as it says.
TEST(DocsTest, PlanningSnippet) {
  torch::manual_seed(0);
  torch::nn::Sequential sequential;
  for (int k = 0; k < 4; ++k) {
    sequential->push_back(torch::nn::Linear(32, 32));
    sequential->push_back(torch::nn::Tanh());
  }
  const torch::Tensor input = torch::randn({64, 32}), target = torch::randn({64, 32});
  const schedule::LossFunction mse = [](const Batch& output, const Batch& target) {
    return torch::mse_loss(output.tensor(), target.tensor());
  };
  // clang-format off
  const gpipe::PlanReport report = gpipe::plan(
      sequential, /*sample=*/input, target, mse,  // the batch and loss it will train with
      gpipe::PlanOptions(/*workers=*/2).memory_cap(64 << 20).param_scale(4.0));  // Adam
  std::cout << report;  // the ranked plans, the families ruled out and why
  const gpipe::Plan& best = report.best();
  gpipe::schedule::PipelineSchedule pipe(
      sequential, best.balance, mse,
      gpipe::schedule::PipelineScheduleOptions(best.microbatches)
          .schedule(best.schedule)
          .stages_per_worker(best.stages_per_worker)
          .checkpoint(best.checkpoint));
  // clang-format on
  const torch::Tensor loss = pipe.step(input, target);
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  EXPECT_LE(best.largest_peak_bytes(), 64 << 20);
}

// docs/planning.md, "On ranks": compiled only, since it needs a launcher's ranks
// (DistributedSharePlansTest runs share_plans).
[[maybe_unused]] gpipe::Plan plan_on_ranks(const torch::nn::Sequential& model,
                                           const torch::Tensor& sample,
                                           std::chrono::milliseconds timeout) {
  // clang-format off
auto group = gpipe::distributed::rendezvous(gpipe::distributed::read_environment(), timeout);
const gpipe::Plan choice = gpipe::distributed::share_plans(group, [&] {
  return std::vector<gpipe::Plan>{
      gpipe::plan(model, sample, gpipe::PlanOptions(group.world_size()).ranks(true)).best()};
})[0];
  // clang-format on
  return choice;
}

}  // namespace
}  // namespace docs_test
}  // namespace gpipe

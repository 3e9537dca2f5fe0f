// The planner (gpipe/plan.h): what it ranks, what the cap rules out and why, and its choices
// under a tight cap and on uneven layers.
#include "test_util.h"

#include "gpipe/balance/balance.h"
#include "gpipe/memory.h"
#include "gpipe/plan.h"
#include "gpipe/schedule/runtime.h"
#include "models/char_gpt.h"
#include "models/unet.h"
#include "plan/stage_memory.h"
#include "plan/tied_memory.h"

#include <torch/torch.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <thread>

namespace gpipe {
namespace plan_test {
namespace {

using schedule::ScheduleKind;

// `layers` x (Linear(width) + ReLU), as one Sequential of 2 x layers layers.
torch::nn::Sequential mlp(int64_t layers, int64_t width) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t k = 0; k < layers; ++k) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::ReLU());
  }
  return model;
}

PlanOptions quick(int64_t workers) {
  return PlanOptions(workers)
      .schedules({ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble})
      .microbatches({2, 4})
      .repetitions(1);
}

bool any_reason_contains(const PlanReport& report, const std::string& text) {
  return std::any_of(report.rejected.begin(), report.rejected.end(),
                     [&](const Rejection& r) { return r.reason.find(text) != std::string::npos; });
}

TEST(PlanTest, RanksWholePlansFastestFirst) {
  const auto model = mlp(4, 32);
  const PlanReport report = plan(model, torch::randn({32, 32}), quick(2));
  ASSERT_FALSE(report.plans.empty());
  for (size_t k = 0; k < report.plans.size(); ++k) {
    const Plan& p = report.plans[k];
    if (k > 0) EXPECT_LE(report.plans[k - 1].step_seconds, p.step_seconds);
    EXPECT_EQ(static_cast<int64_t>(p.balance.size()), 2 * p.stages_per_worker);
    EXPECT_EQ(std::accumulate(p.balance.begin(), p.balance.end(), int64_t{0}), 8);
    EXPECT_TRUE(std::all_of(p.balance.begin(), p.balance.end(), [](int64_t b) { return b > 0; }));
    EXPECT_EQ(p.peak_bytes.size(), 2u);
    EXPECT_GT(p.step_seconds, 0);
    EXPECT_GE(p.bubble_fraction, 0);
    EXPECT_LT(p.bubble_fraction, 1);
  }
  // Without a cap, checkpointing only adds time: every family plans without it.
  for (const Plan& p : report.plans) EXPECT_EQ(p.checkpoint, CheckpointMode::kNever);
  EXPECT_TRUE(any_reason_contains(report, "fits without checkpointing"));
  EXPECT_EQ(&report.best(), &report.plans.front());
  EXPECT_GT(report.profile_seconds, 0);
}

// Under a cap of one byte nothing fits, and each family says what its leanest balance needs:
// per family, that need.
std::map<std::string, int64_t> least_needs(const torch::nn::Sequential& model,
                                           const torch::Tensor& sample, PlanOptions options) {
  const PlanReport none = plan(model, sample, options.memory_cap(1));
  EXPECT_TRUE(none.plans.empty());
  std::map<std::string, int64_t> needs;
  for (const Rejection& r : none.rejected) {
    if (r.peak_bytes > 0) needs[r.family] = r.peak_bytes;
  }
  return needs;
}

TEST(PlanTest, ACapRulesOutWhatIsOverItAndSaysSo) {
  const auto model = mlp(4, 32);
  const torch::Tensor sample = torch::randn({64, 32});
  std::vector<int64_t> needs;
  for (const auto& [family, need] : least_needs(model, sample, quick(2))) needs.push_back(need);
  std::sort(needs.begin(), needs.end());
  ASSERT_LT(needs.front(), needs.back());
  const int64_t cap = (needs.front() + needs.back()) / 2;

  const PlanReport capped = plan(model, sample, quick(2).memory_cap(cap));
  ASSERT_FALSE(capped.plans.empty());
  for (const Plan& p : capped.plans) EXPECT_LE(p.largest_peak_bytes(), cap) << p.family();
  EXPECT_TRUE(any_reason_contains(capped, "over the cap"));
}

TEST(PlanTest, UnderATightCapItCheckpoints) {
  // Blocks that widen 16 -> 512 and narrow back: a checkpoint keeps a 16-wide input where the
  // forward keeps 512-wide activations. Weights left out (param_scale 0): activations decide.
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int k = 0; k < 4; ++k) {
    model->push_back(torch::nn::Linear(16, 512));
    model->push_back(torch::nn::ReLU());
    model->push_back(torch::nn::Linear(512, 16));
  }
  const torch::Tensor sample = torch::randn({256, 16});
  const PlanOptions options = quick(2).microbatches({4}).param_scale(0);
  int64_t never = std::numeric_limits<int64_t>::max(), checkpointed = never;
  for (const auto& [family, need] : least_needs(model, sample, options)) {
    int64_t& least = family.find("checkpoint never") != std::string::npos ? never : checkpointed;
    least = std::min(least, need);
  }
  ASSERT_LT(checkpointed, never) << "checkpointing should need less memory here";

  // Halfway: under what a balance without checkpointing needs, though the balance search starts
  // from the profile's times, which differ from one plan() to the next.
  const int64_t cap = (checkpointed + never) / 2;
  const PlanReport tight = plan(model, sample, PlanOptions(options).memory_cap(cap));
  ASSERT_FALSE(tight.plans.empty());
  EXPECT_NE(tight.best().checkpoint, CheckpointMode::kNever);
  EXPECT_LE(tight.best().largest_peak_bytes(), cap);
  EXPECT_TRUE(any_reason_contains(tight, "over the cap"));
}

TEST(PlanTest, NoPlanFitsNamesEveryReason) {
  const PlanReport report = plan(mlp(2, 8), torch::randn({8, 8}), quick(2).memory_cap(1));
  EXPECT_TRUE(report.plans.empty());
  GPIPE_EXPECT_THROW_WITH(report.best(), c10::ValueError, "no plan fits");
  GPIPE_EXPECT_THROW_WITH(report.best(), c10::ValueError, "over the cap");
}

TEST(PlanTest, FamiliesThatCannotRunAreRuledOutWithTheReason) {
  // 4 layers on 4 workers: the V kinds need 8 stages; DualPipeV needs 8 micro-batches.
  const PlanReport report =
      plan(mlp(2, 8), torch::randn({8, 8}),
           PlanOptions(4)
               .schedules({ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleV})
               .microbatches({4})
               .repetitions(1));
  EXPECT_TRUE(any_reason_contains(report, "more stages (8) than layers (4)"));
  ASSERT_FALSE(report.plans.empty());
  EXPECT_EQ(report.best().schedule, ScheduleKind::kOneFOneB);

  const PlanReport few =
      plan(mlp(4, 8), torch::randn({8, 8}),
           PlanOptions(2).schedules({ScheduleKind::kDualPipeV}).microbatches({2}).repetitions(1));
  EXPECT_TRUE(any_reason_contains(few, "too few micro-batches: needs at least 4"));
}

TEST(PlanTest, BalancesUnevenLayersByTheirCost) {
  // Three heavy layers first, then five light ones: an even split of 4 + 4 layers would put
  // nearly all the work on the first worker.
  torch::manual_seed(0);
  torch::nn::Sequential uneven;
  uneven->push_back(torch::nn::Linear(64, 512));
  uneven->push_back(torch::nn::Linear(512, 512));
  uneven->push_back(torch::nn::Linear(512, 64));
  for (int k = 0; k < 5; ++k) uneven->push_back(torch::nn::Linear(64, 64));
  const PlanReport report =
      plan(uneven, torch::randn({256, 64}),
           PlanOptions(2).schedules({ScheduleKind::kOneFOneB}).microbatches({4}).repetitions(3));
  const std::vector<int64_t> balance = report.best().balance;
  ASSERT_EQ(balance.size(), 2u);
  EXPECT_LT(balance[0], 4) << "the heavy layers should share no stage with many light ones";
}

// The memory model against a real step on worker threads: per worker, what its stages
// allocate above what they held before the step (the tracking allocator's tag per stage; their
// peaks added, as the model adds them) against the prediction less the layers' weights and
// gradients. The balance is chosen from timings, so each model leaves the planner one: 8 layers
// on 1 worker, whose activations chain within its stage; 2 layers of 4 on 2 workers. A cap must
// hold: no prediction is more than 10% under what the step held, GPipe's or ZB1P's (whose split
// backward holds what its input half left between its halves). GPipe's chain on one worker is
// also within 10% over; elsewhere the model runs higher (docs/planning.md).
schedule::LossFunction mse() {
  return [](const Batch& output, const Batch& target) {
    return torch::mse_loss(output.tensor(), target.tensor());
  };
}

// Per worker, the plan's prediction less the layers' weights and gradients over what a real
// step on worker threads held.
std::vector<double> predicted_over_measured(torch::nn::Sequential model, const Plan& p,
                                            const torch::Tensor& input, const torch::Tensor& target,
                                            const schedule::LossFunction& loss, int64_t workers) {
  schedule::PipelineSchedule pipe(model, p.balance, loss,
                                  schedule::PipelineScheduleOptions(p.microbatches)
                                      .schedule(p.schedule)
                                      .stages_per_worker(p.stages_per_worker));
  model->zero_grad();
  pipe.step(input, target);  // the gradients, kept from here on
  std::vector<int64_t> before(workers);
  for (int64_t w = 0; w < workers; ++w) before[w] = memory::cpu_worker_current_bytes(w);
  memory::reset_cpu_peak();
  pipe.step(input, target);
  std::vector<int64_t> measured(workers, 0), predicted = p.peak_bytes;
  for (int64_t w = 0; w < workers; ++w) measured[w] = memory::cpu_worker_peak_bytes(w) - before[w];
  int64_t layer = 0;
  for (const auto s : c10::irange(p.balance.size())) {
    const int64_t w = schedule::worker_of(schedule::placement_of(p.schedule), s, workers);
    for (int64_t k = 0; k < p.balance[s]; ++k, ++layer) {
      for (const auto& parameter : model->ptr(static_cast<size_t>(layer))->parameters()) {
        predicted[w] -= 2 * static_cast<int64_t>(parameter.nbytes());  // param_scale 2
      }
    }
  }
  std::vector<double> ratios;
  for (int64_t w = 0; w < workers; ++w) {
    ratios.push_back(static_cast<double>(predicted[w]) / static_cast<double>(measured[w]));
  }
  return ratios;
}

void expect_predicted_activations(torch::nn::Sequential model, int64_t workers, bool close,
                                  const schedule::LossFunction& loss = mse()) {
  const torch::Tensor input = torch::randn({512, 64});
  const torch::Tensor target = torch::randn({512, 64});
  const PlanReport report = plan(model, input, target, loss,
                                 quick(workers)
                                     .schedules({ScheduleKind::kGPipe, ScheduleKind::kZeroBubble})
                                     .microbatches({4}));
  ASSERT_EQ(report.plans.size(), 2u);
  for (const Plan& p : report.plans) {
    SCOPED_TRACE(p.family());
    const std::vector<double> ratios =
        predicted_over_measured(model, p, input, target, loss, workers);
    for (int64_t w = 0; w < workers; ++w) {
      EXPECT_GE(ratios[w], 0.9) << "worker " << w << " of " << workers;
      if (close && p.schedule == ScheduleKind::kGPipe) EXPECT_LE(ratios[w], 1.1) << "worker " << w;
    }
  }
}

// Linear + ReLU + Linear + ReLU as one layer.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : first(register_module("first", torch::nn::Linear(64, 64))),
        second(register_module("second", torch::nn::Linear(64, 64))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::relu(second(torch::relu(first(x))));
  }
  torch::nn::Linear first, second;
};
TORCH_MODULE(Block);

// Between ranks, a stage also holds copies of what crosses: its input per micro-batch it holds
// (checkpointed, the input it keeps anyway), the messages of its outputs until their gradients
// come back, and of the gradients it sent until the step ends; within a process none of them.
TEST(PlanTest, RanksHoldCopiesOfWhatCrossesBetweenThem) {
  std::vector<plan_detail::LayerCosts> layers(3);
  for (int64_t k = 0; k < 3; ++k) {
    layers[k].activation_bytes = 1000;
    layers[k].input_bytes = 100 * (k + 1);  // 100, 200, 300
  }
  const std::vector<int64_t> first{0, 1, 2, 3};  // a layer per stage
  schedule::HeldMicrobatches moment;
  moment.live = 3;
  moment.sent_upstream = 2;
  moment.unreturned = 1;
  for (const auto& [from_rank, to_rank] : std::vector<std::pair<bool, bool>>{
           {false, false}, {true, false}, {false, true}, {true, true}}) {
    for (const auto mode :
         {CheckpointMode::kNever, CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
      plan_detail::StageMemory memory = plan_detail::stage_memory(layers, {}, first, 1, 2.0);
      const int64_t within = memory.held(moment, mode);
      memory.input_from_rank = from_rank;
      memory.output_to_rank = to_rank;
      // Its input (200 bytes) per micro-batch held - checkpointed, the input it keeps is the
      // copy - and per gradient sent; its output (300) per output unreturned.
      // Checkpointed, its output (300) per micro-batch held too.
      const bool checkpointed = mode != CheckpointMode::kNever;
      EXPECT_EQ(memory.held(moment, mode) - within,
                (from_rank ? (checkpointed ? 0 : 3 * 200) + 2 * 200 : 0) +
                    (to_rank ? 1 * 300 + (checkpointed ? 3 * 300 : 0) : 0))
          << from_rank << " " << to_rank << " " << mode;
    }
  }
}

// The middle stage of three, a layer each, whose inputs are 100, 200 and 300 bytes: it receives
// 200 and sends 300.
plan_detail::StageMemory middle_of_three() {
  std::vector<plan_detail::LayerCosts> layers(3);
  for (int64_t k = 0; k < 3; ++k) layers[k].input_bytes = 100 * (k + 1);
  return plan_detail::stage_memory(layers, {}, {0, 1, 2, 3}, 1, 2.0);
}

// Between ranks, each receive posted ahead holds a buffer of one message: per edge from another
// rank, up to the window of the messages still to come, and the one an action that starts takes.
// Measured on 2 ranks (char GPT, 1F1B, 16 checkpointed micro-batches): each receive more in the
// window held 66 KiB more on rank 0, its 64 KiB gradient and the message's header.
TEST(PlanTest, RanksHoldTheBuffersOfReceivesPostedAhead) {
  using Starting = schedule::HeldMicrobatches::Starting;
  schedule::HeldMicrobatches moment;
  moment.forwards_left = 5;
  moment.backwards_left = 1;
  for (const auto starting : {Starting::kNothing, Starting::kForward, Starting::kBackward,
                              Starting::kBackwardInput, Starting::kBackwardWeight}) {
    moment.starting = starting;
    for (const int64_t window : {1, 2, 8}) {
      plan_detail::StageMemory memory = middle_of_three();
      memory.receive_window = window;
      const int64_t within = memory.held(moment, CheckpointMode::kNever);
      memory.input_from_rank = true;
      memory.output_to_rank = true;
      // Activations in (200 bytes): the window's of the 5 to come, and one more as a forward
      // takes its own. Gradients in (300): of the 1 to come, and one more as a backward (or
      // its input half) takes its own.
      const bool backward = starting == Starting::kBackward || starting == Starting::kBackwardInput;
      EXPECT_EQ(memory.held(moment, CheckpointMode::kNever) - within,
                std::min<int64_t>(window, 5) * 200 + (starting == Starting::kForward ? 200 : 0) +
                    1 * 300 + (backward ? 300 : 0))
          << window << " " << static_cast<int>(starting);
    }
  }
}

// A batch travels between ranks with its header, packed into one message (a copy) up to the
// transport's limit, else as its own tensors, uncopied: its receive holds only the header until
// the header has come, and a send of an output holds nothing its stage does not keep anyway.
TEST(PlanTest, RanksCountTheMessagesABatchTravelsIn) {
  using Starting = schedule::HeldMicrobatches::Starting;
  schedule::HeldMicrobatches moment;
  moment.live = 3;
  moment.unreturned = 1;
  moment.sent_upstream = 2;
  moment.forwards_left = 5;
  moment.backwards_left = 1;
  moment.starting = Starting::kBackward;
  plan_detail::StageMemory memory = middle_of_three();
  memory.receive_window = 2;
  memory.message_header = 10;
  memory.one_message_bytes = 250;  // its input (200) is packed, its output (300) is not
  const int64_t within = memory.held(moment, CheckpointMode::kNever);
  memory.input_from_rank = true;
  memory.output_to_rank = true;
  // Input, 210 a message: one per micro-batch held, per gradient sent, per receive posted.
  // Output, uncopied: its gradient's receives hold a header each until it comes (10), the one
  // this backward takes is its own 300, and the output awaiting its gradient costs nothing more.
  EXPECT_EQ(memory.held(moment, CheckpointMode::kNever) - within,
            3 * 210 + 2 * 210 + 2 * 210 + 1 * 10 + 300);
  // Checkpointed, each micro-batch holds the header of the message its input came in, and its
  // output.
  memory.input_from_rank = memory.output_to_rank = false;
  const int64_t checkpointed = memory.held(moment, CheckpointMode::kAlways);
  memory.input_from_rank = memory.output_to_rank = true;
  EXPECT_EQ(memory.held(moment, CheckpointMode::kAlways) - checkpointed,
            3 * (10 + 300) + 2 * 210 + 2 * 210 + 1 * 10 + 300);
}

// Checkpointed, the last stage keeps what its loss saved per micro-batch it holds (the loss runs
// outside the checkpoint), and recomputes only its layers' activations.
TEST(PlanTest, ACheckpointedLastStageKeepsWhatItsLossSaved) {
  std::vector<plan_detail::LayerCosts> layers(2);
  for (int64_t k = 0; k < 2; ++k) {
    layers[k].activation_bytes = 1000;
    layers[k].chained_activation_bytes = 1000;
    layers[k].input_bytes = 100;
  }
  plan_detail::LayerCosts loss;
  loss.activation_bytes = 50;
  const std::vector<int64_t> first{0, 1, 2};
  schedule::HeldMicrobatches moment;
  moment.live = 3;
  const plan_detail::StageMemory last = plan_detail::stage_memory(layers, loss, first, 1, 2.0);
  EXPECT_EQ(last.held(moment, CheckpointMode::kAlways), 3 * (100 + 50));
  moment.starting = schedule::HeldMicrobatches::Starting::kBackward;
  EXPECT_EQ(last.held(moment, CheckpointMode::kAlways), 3 * (100 + 50) + 1000);
  const plan_detail::StageMemory before = plan_detail::stage_memory(layers, loss, first, 0, 2.0);
  EXPECT_EQ(before.held(moment, CheckpointMode::kAlways), 3 * 100 + 1000);  // no loss
}

// A parameter tied across ranks costs each of them more through a step: the receive of every
// other rank's part of its gradient, in double precision, and the step's own gradient beside the
// one set aside. The char GPT's head projects with its token embedding's weight.
TEST(PlanTest, RanksHoldWhatSummingTheirTiedGradientsTakes) {
  const models::CharGPTOptions options;
  const auto model = models::char_gpt(options);
  const int64_t L = static_cast<int64_t>(model->size());
  const auto tied = plan_detail::tied_parameters(model);
  ASSERT_EQ(tied.size(), 1u);
  EXPECT_EQ(tied[0].layers, (std::vector<int64_t>{0, L - 1}));
  const int64_t numel = options.vocab_size() * options.embedding_dim();
  EXPECT_EQ(tied[0].numel, numel);
  EXPECT_EQ(tied[0].bytes, numel * 4);
  EXPECT_TRUE(
      plan_detail::tied_parameters(models::char_gpt(models::CharGPTOptions().tie_embeddings(false)))
          .empty());
  std::vector<int64_t> two_ranks(L, 0);
  std::fill(two_ranks.begin() + L / 2, two_ranks.end(), 1);
  for (const int64_t w : {0, 1}) {
    EXPECT_EQ(plan_detail::tied_bytes_between_ranks(tied, two_ranks, w), numel * 8 + numel * 4);
  }
  // Within one rank (a V's first and last stage), nothing crosses.
  EXPECT_EQ(plan_detail::tied_bytes_between_ranks(tied, std::vector<int64_t>(L, 0), 0), 0);
  // Among three ranks, two others' parts; a rank without the parameter holds nothing for it.
  const std::vector<plan_detail::TiedParameter> three{{{0, 1, 2}, 400, 100}};
  EXPECT_EQ(plan_detail::tied_bytes_between_ranks(three, {0, 1, 2}, 1), 2 * 100 * 8 + 400);
  EXPECT_EQ(plan_detail::tied_bytes_between_ranks(three, {0, 1, 1}, 0), 100 * 8 + 400);
  EXPECT_EQ(plan_detail::tied_bytes_between_ranks(three, {0, 0, 0}, 3), 0);
}

TEST(PlanTest, PredictedActivationsPerWorkerAreWhatAStepHolds) {
  expect_predicted_activations(mlp(4, 64), 1, /*close=*/true);
  torch::manual_seed(0);
  expect_predicted_activations(torch::nn::Sequential(Block(), Block()), 2, /*close=*/false);
}

// A U-Net cut in two: the second stage pops what the first stashed and sends the gradients
// back with its input's. A stage's backward frees its later layers' activations as it runs, so
// their backwards' workspace does not come on top of all of them; the first stage's input half
// computes nothing, so it frees nothing and captures nothing more. ZB1P's workers and 1F1B's
// first are predicted within 10% of what a step held, both ways. Counted the old way (each
// backward's workspace beside all the stage's activations, the first stage's input half as
// any other's), 1F1B's and ZB1P's first workers were 11-12% high, ZB1P's second 18%. 1F1B's
// last worker is counted with one micro-batch's gradients on their way upstream, which have
// sometimes arrived when its peak comes: 1.09-1.25x here. The profile takes the median of 3
// passes (5 here): with 1, a first pass's one-time costs once made the first layer look slow
// enough to cut after it, and that cut (1 of 69 layers) is predicted 18-22% high. A loaded
// machine (ctest -j2) still picks such a stage of one layer now and then (balances 1,68 and
// 20,1,4,44, 1.13- 1.27x), a known limit (docs/planning.md): the plan is made again, at most 3
// times, until every stage has at least two layers.
TEST(PlanTest, PredictedActivationsOfAUNetAreWhatAStepHolds) {
  torch::manual_seed(0);
  const auto model =
      models::unet(models::UNetOptions().depth(3).num_convs(2).base_channels(8).dropout(0));
  const torch::Tensor input = torch::randn({16, 3, 32, 32});
  const torch::Tensor target = (torch::rand({16, 1, 32, 32}) > 0.5).to(torch::kFloat);
  const schedule::LossFunction loss = [](const Batch& output, const Batch& target) {
    return torch::nn::functional::binary_cross_entropy_with_logits(output.tensor(),
                                                                   target.tensor());
  };
  const auto one_layer_stage = [](const PlanReport& report) {
    for (const Plan& p : report.plans) {
      if (*std::min_element(p.balance.begin(), p.balance.end()) < 2) return true;
    }
    return false;
  };
  PlanReport report;
  for (int attempt = 0; attempt < 3 && (attempt == 0 || one_layer_stage(report)); ++attempt) {
    report = plan(model, input, target, loss,
                  PlanOptions(2)
                      .schedules({ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble,
                                  ScheduleKind::kZeroBubbleV, ScheduleKind::kVHalf})
                      .microbatches({4})
                      .repetitions(5)
                      .calibrate(false));
  }
  ASSERT_EQ(report.plans.size(), 4u);
  for (const Plan& p : report.plans) {
    std::string balance;
    for (const int64_t layers : p.balance)
      balance += (balance.empty() ? "" : ",") + std::to_string(layers);
    SCOPED_TRACE(p.family() + ", balance " + balance);
    const std::vector<double> ratios = predicted_over_measured(model, p, input, target, loss, 2);
    for (int64_t w = 0; w < 2; ++w) {
      EXPECT_GE(ratios[w], 0.9) << "worker " << w;
      const bool in_flight = p.schedule == ScheduleKind::kOneFOneB && w == 1;
      EXPECT_LE(ratios[w], in_flight ? 1.3 : 1.1) << "worker " << w;
    }
  }
}

// A loss that widens the output 64 -> 2048 before it reduces keeps 32 times a layer's
// activations for its backward: the last stage's largest share, which the prediction counts.
TEST(PlanTest, PredictedActivationsCountWhatTheLossKeeps) {
  const torch::Tensor projection = torch::randn({64, 2048});
  const schedule::LossFunction wide = [projection](const Batch& output, const Batch& target) {
    return (output.tensor().matmul(projection).tanh() - target.tensor().sum()).pow(2).mean();
  };
  expect_predicted_activations(mlp(4, 64), 1, /*close=*/true, wide);
  expect_predicted_activations(mlp(4, 64), 2, /*close=*/false, wide);
}

// Spins for `seconds` of its thread's CPU time: work that a busy machine stretches as it
// stretches the layers'.
void spin(double seconds) {
  const auto cpu_seconds = [] {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  };
  const double start = cpu_seconds();
  while (cpu_seconds() - start < seconds) {
  }
}

// A loss that costs as much as several layers: the planner counts it to the last stage, which
// then takes fewer layers, and the calibration, which trains with it, does not mistake its
// time for the layers' being slower.
TEST(PlanTest, AnExpensiveLossCountsToTheLastStage) {
  const auto model = mlp(4, 64);
  const torch::Tensor input = torch::randn({64, 64});
  const torch::Tensor target = torch::randn({64, 64});
  const schedule::LossFunction slow = [](const Batch& output, const Batch& target) {
    spin(5e-3);
    return torch::mse_loss(output.tensor(), target.tensor());
  };
  const PlanOptions options =
      PlanOptions(2).schedules({ScheduleKind::kOneFOneB}).microbatches({4}).repetitions(3);

  const PlanOptions uncalibrated = PlanOptions(options).calibrate(false);
  const PlanReport cheap = plan(model, input, target, mse(), uncalibrated);
  const PlanReport costly = plan(model, input, target, slow, uncalibrated);
  // 4 micro-batches' forwards each spin 5 ms on the last stage, all on the critical path.
  EXPECT_GT(costly.best().step_seconds - cheap.best().step_seconds, 4 * 5e-3 * 0.9);
  const std::vector<int64_t> balance = costly.best().balance;
  ASSERT_EQ(balance.size(), 2u);
  EXPECT_EQ(balance[1], 1) << "the last stage should keep one layer beside the loss";

  const PlanReport calibrated = plan(model, input, target, slow, options);
  ASSERT_EQ(calibrated.calibration.size(), 1u);
  // The spin is most of the last stage's forward: counted as a layer's time, the factor would
  // be in the tens.
  EXPECT_LT(calibrated.calibration[0].forward, 4.0);
  EXPECT_EQ(calibrated.best().balance, balance);
}

// Skips (skip/skippable.h): each layer is profiled with what the layers before it stashed,
// popped from a tracker of its own, so that profiling a layer twice (its backward whole, then
// split) pops its skips twice.
TEST(PlanTest, PlansAModelWithSkips) {
  torch::manual_seed(0);
  const auto model =
      models::unet(models::UNetOptions().depth(2).num_convs(1).base_channels(4).dropout(0));
  const torch::Tensor input = torch::randn({8, 3, 16, 16});
  const PlanReport report = plan(model, input, quick(2));
  ASSERT_FALSE(report.plans.empty());
  const Plan& best = report.best();
  schedule::PipelineSchedule pipe(
      model, best.balance,
      [](const Batch& output, const Batch& target) {
        return torch::mse_loss(output.tensor(), target.tensor());
      },
      schedule::PipelineScheduleOptions(best.microbatches)
          .schedule(best.schedule)
          .stages_per_worker(best.stages_per_worker));
  EXPECT_TRUE(pipe.step(input, torch::zeros({8, 1, 16, 16})).defined());
}

// Computes for 5 ms of its thread's CPU time on the thread that made it and 50 ms on any other:
// a layer that costs ten times as much in a pipeline's workers as alone on the planner's
// thread. CPU time, not sleeps, so that a busy machine stretches both alike; several scheduler
// ticks long, so that one tick more or less (4 ms) cannot hide the ratio: at 1 and 10 ms, with
// three busy loops beside the test, 4 of 6 runs calibrated 1.1-2.8.
struct SlowerOnWorkersImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) {
    const double seconds = std::this_thread::get_id() == home ? 5e-3 : 50e-3;
    const double start = thread_cpu_seconds();
    while (thread_cpu_seconds() - start < seconds) {
    }
    return x;
  }
  static double thread_cpu_seconds() {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  }
  std::thread::id home = std::this_thread::get_id();
};
TORCH_MODULE(SlowerOnWorkers);

TEST(PlanTest, CalibrationScalesTheProfileByWhatAPipelineTakes) {
  torch::manual_seed(0);
  const torch::nn::Sequential model(torch::nn::Linear(8, 8), SlowerOnWorkers(),
                                    torch::nn::Linear(8, 8), SlowerOnWorkers());
  const PlanOptions options =
      PlanOptions(2).schedules({ScheduleKind::kGPipe}).microbatches({2}).repetitions(2);
  const torch::Tensor sample = torch::randn({8, 8});
  const PlanReport calibrated = plan(model, sample, options);
  ASSERT_EQ(calibrated.calibration.size(), 1u);
  EXPECT_EQ(calibrated.calibration[0].microbatches, 2);
  // The forwards compute ten times as long in the workers; a busy machine may share its cores
  // differently between the planner's thread and the workers.
  EXPECT_GT(calibrated.calibration[0].forward, 3.0);
  EXPECT_LT(calibrated.calibration[0].forward, 40.0);
  EXPECT_GT(calibrated.calibration[0].backward, 0);

  const PlanReport alone = plan(model, sample, PlanOptions(options).calibrate(false));
  EXPECT_TRUE(alone.calibration.empty());
  EXPECT_GT(calibrated.best().step_seconds, 2.0 * alone.best().step_seconds);
}

// Spins 2 ms of CPU time per forward: layers of one cost, however busy the machine.
struct SpinningImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) {
    spin(2e-3);
    return x * 2;
  }
};
TORCH_MODULE(Spinning);

// Workers that outnumber the cores are planned sharing them: on one core a step takes all its
// work, one action at a time; with a core each some of it runs side by side.
TEST(PlanTest, WorkersThatOutnumberTheCoresShareThem) {
  const torch::nn::Sequential model{Spinning(), Spinning(), Spinning(), Spinning()};
  const torch::Tensor sample = torch::randn({8, 8});
  const PlanOptions options = PlanOptions(2)
                                  .schedules({ScheduleKind::kGPipe})
                                  .microbatches({4})
                                  .repetitions(1)
                                  .calibrate(false);
  const PlanReport own = plan(model, sample, PlanOptions(options).cores(2));
  EXPECT_EQ(own.cores, 0);
  const PlanReport one = plan(model, sample, PlanOptions(options).cores(1));
  EXPECT_EQ(one.cores, 1);
  std::ostringstream table;
  table << one;
  EXPECT_NE(table.str().find("predicted on 1 core shared by the workers"), std::string::npos)
      << table.str();
  // The one core never idles (the bubble is the cores' idle share), and the step is its work.
  const Plan& shared = one.best();
  EXPECT_NEAR(shared.bubble_fraction, 0, 1e-9);
  // GPipe's 4 micro-batches on 2 workers with a core each: a bubble of 1/5.
  const Plan& side_by_side = own.best();
  EXPECT_GT(side_by_side.bubble_fraction, 0.15);
}

// Calibrating trains the model for a few steps: its values, running statistics, modes and
// gradients are as they were afterwards.
TEST(PlanTest, CalibrationLeavesTheModelAsItWas) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::BatchNorm1d(8),
                              torch::nn::Linear(8, 8), torch::nn::Dropout(0.5));
  model->eval();
  std::vector<torch::Tensor> before;
  for (const auto& t : model->parameters()) before.push_back(t.detach().clone());
  for (const auto& t : model->buffers()) before.push_back(t.detach().clone());

  const PlanReport report = plan(model, torch::randn({8, 8}), quick(2));
  ASSERT_EQ(report.calibration.size(), 2u);  // micro-batches 2 and 4
  for (const auto& c : report.calibration) {
    EXPECT_TRUE(std::isfinite(c.forward) && c.forward > 0) << c.forward;
    EXPECT_TRUE(std::isfinite(c.backward) && c.backward > 0) << c.backward;
  }

  size_t k = 0;
  for (const auto& t : model->parameters()) {
    EXPECT_TRUE(torch::equal(t, before[k++]));
    EXPECT_FALSE(t.grad().defined());
  }
  for (const auto& t : model->buffers()) EXPECT_TRUE(torch::equal(t, before[k++]));
  for (const auto& m : model->modules()) EXPECT_FALSE(m->is_training());
}

// Calibrating needs a loss of the output, its half squares: an output with no floating-point
// tensor is named, and calibrate(false) plans it still.
struct ArgmaxImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) { return x.argmax(1); }
};
TORCH_MODULE(Argmax);

TEST(PlanTest, CalibrationNamesAnOutputItCannotTakeALossOf) {
  torch::manual_seed(0);
  const torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8), Argmax());
  const torch::Tensor sample = torch::randn({8, 8});
  const PlanOptions options =
      PlanOptions(2).schedules({ScheduleKind::kGPipe}).microbatches({2}).repetitions(1);
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, options), c10::Error,
                          "the model's output has no floating-point tensor to calibrate the "
                          "planner's profile with a loss");
  EXPECT_FALSE(plan(model, sample, PlanOptions(options).calibrate(false)).plans.empty());
}

TEST(PlanTest, ALossOrTargetItCannotUseIsNamed) {
  const auto model = mlp(2, 8);
  const torch::Tensor sample = torch::randn({8, 8});
  const PlanOptions options = quick(2).calibrate(false);
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, torch::randn({6, 8}), mse(), options),
                          c10::ValueError, "the target's batch size must be the sample's (8)");
  GPIPE_EXPECT_THROW_WITH(
      plan(model, sample, torch::randn({8, 8}), schedule::LossFunction(), options), c10::ValueError,
      "the loss function is empty");
  const schedule::LossFunction per_sample = [](const Batch& output, const Batch& target) {
    return (output.tensor() - target.tensor()).pow(2).mean(1);
  };
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, torch::randn({8, 8}), per_sample, options),
                          c10::ValueError, "the loss function must return a scalar");
}

TEST(PlanTest, BadOptionsAreNamed) {
  const auto model = mlp(2, 8);
  const torch::Tensor sample = torch::randn({8, 8});
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, PlanOptions(0)), c10::ValueError, "workers: 0");
  GPIPE_EXPECT_THROW_WITH(plan(torch::nn::Sequential(), sample, PlanOptions(2)), c10::ValueError,
                          "the model has no layers to plan");
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, PlanOptions(2).memory_cap(-1)), c10::ValueError,
                          "memory_cap: -1");
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, PlanOptions(2).schedules({})), c10::ValueError,
                          "schedules is empty");
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, PlanOptions(2).microbatches({9})), c10::ValueError,
                          "microbatches: 9");
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, PlanOptions(2).param_scale(-1)), c10::ValueError,
                          "param_scale: -1");
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, PlanOptions(2).receive_window(-1)), c10::ValueError,
                          "receive_window: -1");
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, PlanOptions(2).cores(-1)), c10::ValueError,
                          "cores: -1");
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, PlanOptions(2).intra_op_threads(0)), c10::ValueError,
                          "intra_op_threads: 0");
  GPIPE_EXPECT_THROW_WITH(plan(model, sample, PlanOptions(2).repetitions(0)), c10::ValueError,
                          "repetitions: 0");
}

}  // namespace
}  // namespace plan_test
}  // namespace gpipe

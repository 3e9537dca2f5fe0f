// Tests of the training recipes across processes (PipelineStage on 2 and 4 ranks, and replicas):
// tied weights whose copies live on different ranks get the plain model's gradient and stay
// equal; the global gradient clip is the plain model's, its norm bitwise that of the same
// gradients; evaluation gives the plain model's output and loss; a grad scaler makes every rank
// skip the step in which one rank overflowed; under autocast every layer sees what the plain
// model's sees. float64 comparisons hold to 1e-12 of the largest value.
#include "test_util.h"

#include "distributed_launch.h"
#include "distributed_model.h"
#include "plain_reference.h"

#include <torch/torch.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace gpipe {
namespace distributed {
namespace distributed_recipes_test {
namespace {

// One line of a rank's recipe_rank<r>.txt.
struct LoggedStep {
  double loss = 0;
  std::string norm;  // as written, 17 digits
  bool stepped = false;
  double scale = 0;
};

std::vector<LoggedStep> read_log(const std::string& dir, int rank) {
  std::ifstream in(dir + "/recipe_rank" + std::to_string(rank) + ".txt");
  std::vector<LoggedStep> steps;
  std::string word;
  int64_t k = 0;
  LoggedStep s;
  while (in >> word >> k >> word >> s.loss >> word >> s.norm >> word >> s.stepped >> word >>
         s.scale) {
    steps.push_back(s);
  }
  return steps;
}

std::vector<at::Tensor> load(const std::string& path) {
  std::vector<at::Tensor> tensors;
  torch::load(tensors, path);
  return tensors;
}

at::Tensor load_tensor(const std::string& path) {
  at::Tensor tensor;
  torch::load(tensor, path);
  return tensor;
}

bool close(const at::Tensor& actual, const at::Tensor& expected) {
  return actual.defined() && expected.defined() && actual.sizes() == expected.sizes() &&
         testing::relative_difference(actual, expected) <= 1e-12;
}

// The plain tied model trained as the worker trains it: SGD (lr 0.1) on each parameter once,
// clipped to `clip` (> 0), the steps in `skipped` left out.
struct PlainTraining {
  torch::nn::Sequential model = testing::tied_model();
  std::vector<double> norms;               // per step
  std::vector<at::Tensor> last_unclipped;  // the last step's, each parameter once
  at::Tensor output_before;                // of the micro-batches, concatenated
  at::Tensor loss_before;
};

PlainTraining train_plain(int64_t steps, double clip, int64_t chunks,
                          const std::set<int64_t>& skipped = {}) {
  PlainTraining plain;
  const auto [input, target] = testing::tied_batch();
  {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> outputs;
    for (const auto& x : input.chunk(chunks)) outputs.push_back(plain.model->forward(x));
    plain.output_before = torch::cat(outputs);
    plain.loss_before = torch::mse_loss(plain.model->forward(input), target);
  }
  const auto parameters = testing::unique(plain.model->parameters());
  torch::optim::SGD sgd(parameters, 0.1);
  for (int64_t step = 0; step < steps; ++step) {
    sgd.zero_grad();
    torch::mse_loss(plain.model->forward(input), target).backward();
    if (step == steps - 1) {
      for (const auto& p : parameters) plain.last_unclipped.push_back(p.grad().clone());
    }
    if (clip > 0) plain.norms.push_back(torch::nn::utils::clip_grad_norm_(parameters, clip));
    if (!skipped.count(step)) sgd.step();
  }
  return plain;
}

// Stage s's parameters in the plain model, in order.
std::vector<at::Tensor> stage_parameters(torch::nn::Sequential model,
                                         const std::vector<int64_t>& balance, int64_t s) {
  int64_t first = 0;
  for (int64_t k = 0; k < s; ++k) first += balance[k];
  std::vector<at::Tensor> result;
  for (int64_t layer = first; layer < first + balance[s]; ++layer) {
    for (const auto& p : model->ptr(layer)->parameters()) result.push_back(p);
  }
  return result;
}

// Tied weights, clipping and evaluation on `ranks` ranks under `schedule`: 3 SGD steps on the
// tied model, clipped to 0.05.
void expect_tied_training(int ranks, const std::string& schedule, int64_t stages_per_worker,
                          int64_t replicas = 1) {
  SCOPED_TRACE(std::to_string(ranks) + " ranks, " + schedule + ", " + std::to_string(replicas) +
               " replica(s)");
  const int64_t steps = 3, chunks = 4;
  const double clip = 0.05;
  const testing::Launch launch = testing::launch_workers(
      ranks, "--tied 1 --optimizer-steps 3 --clip 0.05 --evaluate 1 --schedule " + schedule +
                 " --stages-per-worker " + std::to_string(stages_per_worker) + " --data-parallel " +
                 std::to_string(replicas) + " --chunks " + std::to_string(chunks));
  ASSERT_EQ(launch.exit_code, 0) << launch.output;
  PlainTraining plain = train_plain(steps, clip, chunks);
  const int64_t S = ranks / replicas * stages_per_worker;
  const std::vector<int64_t> balance = testing::distributed_balance(S);
  const auto trained = plain.model->parameters();  // the tie first and last

  // Every rank clipped by the plain model's norm.
  for (int r = 0; r < ranks; ++r) {
    const auto log = read_log(launch.dir, r);
    ASSERT_EQ(log.size(), static_cast<size_t>(steps)) << "rank " << r;
    for (int64_t k = 0; k < steps; ++k) {
      EXPECT_NEAR(std::stod(log[k].norm), plain.norms[k], 1e-12 * plain.norms[k])
          << "rank " << r << ", step " << k;
      EXPECT_EQ(log[k].norm, read_log(launch.dir, 0)[k].norm) << "rank " << r << ", step " << k;
    }
  }
  for (int64_t d = 0; d < replicas; ++d) {
    const std::string replica = "_replica" + std::to_string(d) + ".pt";
    // The norm is bitwise clip_grad_norm_'s of the gradients the ranks clipped: each parameter
    // once, in the model's order (the tie from stage 0).
    std::vector<at::Tensor> unclipped;
    for (int64_t s = 0; s < S; ++s) {
      const auto grads = load(launch.dir + "/unclipped_stage" + std::to_string(s) + replica);
      const auto expected = stage_parameters(plain.model, balance, s);
      ASSERT_EQ(grads.size(), expected.size());
      for (size_t k = 0; k < grads.size(); ++k) {
        const bool tie = expected[k].is_same(trained.front());
        if (!(tie && s > 0)) {
          auto leaf = torch::zeros_like(grads[k]).requires_grad_(true);
          leaf.mutable_grad() = grads[k].clone();
          unclipped.push_back(leaf);
        }
      }
    }
    std::ostringstream norm;
    norm.precision(17);
    norm << torch::nn::utils::clip_grad_norm_(unclipped, clip);
    EXPECT_EQ(read_log(launch.dir, 0).back().norm, norm.str()) << "replica " << d;
    // The tie's gradient, clipped, and its trained copies: the plain model's, and equal on the
    // ranks that hold them.
    const auto first = load(launch.dir + "/params_stage0" + replica);
    const auto last = load(launch.dir + "/params_stage" + std::to_string(S - 1) + replica);
    EXPECT_TRUE(testing::bitwise_equal(first.front(), last.back())) << "replica " << d;
    const auto first_grads = load(launch.dir + "/grads_stage0" + replica);
    const auto last_grads = load(launch.dir + "/grads_stage" + std::to_string(S - 1) + replica);
    EXPECT_TRUE(testing::bitwise_equal(first_grads.front(), last_grads.back()));
    size_t next = 0;  // into plain.last_unclipped, each parameter once
    for (int64_t s = 0; s < S; ++s) {
      const auto params = load(launch.dir + "/params_stage" + std::to_string(s) + replica);
      const auto grads = load(launch.dir + "/unclipped_stage" + std::to_string(s) + replica);
      const auto expected = stage_parameters(plain.model, balance, s);
      for (size_t k = 0; k < params.size(); ++k) {
        EXPECT_TRUE(close(params[k], expected[k].detach()))
            << "stage " << s << ", replica " << d << ", parameter " << k;
        const bool tie = expected[k].is_same(trained.front());
        const at::Tensor& plain_grad =
            tie ? plain.last_unclipped.front() : plain.last_unclipped[next];
        if (!tie || s == 0) ++next;
        EXPECT_TRUE(close(grads[k], plain_grad))
            << "gradient, stage " << s << ", replica " << d << ", parameter " << k;
      }
    }
  }
  // Evaluation, before training: bitwise the plain model's output on the same micro-batches.
  if (replicas == 1) {
    const at::Tensor output = load_tensor(launch.dir + "/eval_before_output_replica0.pt");
    EXPECT_TRUE(testing::bitwise_equal(output, plain.output_before));
    torch::NoGradGuard no_grad;
    const auto [input, target] = testing::tied_batch();
    const at::Tensor after = load_tensor(launch.dir + "/eval_after_output_replica0.pt");
    EXPECT_TRUE(close(after, plain.model->forward(input)));
  }
  for (int r = 0; r < ranks; ++r) {
    const std::string suffix = "_rank" + std::to_string(r) + ".pt";
    EXPECT_TRUE(close(load_tensor(launch.dir + "/eval_before_loss" + suffix), plain.loss_before))
        << "rank " << r;
  }
}

TEST(DistributedRecipesTest, TiedClippedEvaluatedOnTwoRanksEverySchedule) {
  for (const auto& [schedule, per_rank] :
       std::vector<std::pair<std::string, int64_t>>{{"gpipe", 1},
                                                    {"1f1b", 1},
                                                    {"zb1p", 1},
                                                    {"interleaved_1f1b", 2},
                                                    {"interleaved_zb1p", 2},
                                                    {"looped_bfs", 2},
                                                    {"zbv", 2},
                                                    {"dualpipev", 2},
                                                    {"v_min", 2},
                                                    {"v_half", 2}}) {
    expect_tied_training(2, schedule, per_rank);
  }
}

// On 4 ranks the tie spans ranks 0 and 3 (looped placements) or stays on rank 0 (the V); with
// replicas, each replica sums its own tie, then the replicas average.
TEST(DistributedRecipesTest, TiedOnFourRanksAndReplicas) {
  expect_tied_training(4, "1f1b", 1);
  expect_tied_training(4, "interleaved_1f1b", 2);
  expect_tied_training(4, "zbv", 2);
  expect_tied_training(4, "1f1b", 1, /*replicas=*/2);
}

TEST(DistributedRecipesTest, DifferentTiedCopiesAreRefusedByEveryRank) {
  const testing::Launch launch =
      testing::launch_workers(2, "--tied 1 --perturb-tie 1 --optimizer-steps 1", 10);
  EXPECT_NE(launch.exit_code, 0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(testing::read_text(launch.dir + "/error_rank" + std::to_string(r)),
                ::testing::HasSubstr("parameter '0.weight' is tied across stages 0, 1 on ranks "
                                     "0, 1, but its copies there differ (by up to 0.001"))
        << launch.output;
  }
}

// A grad scaler: rank `overflow_rank` overflows in step 1 of 4; every rank skips that step and
// only that one, and backs off alike; the parameters are the plain model's trained without it.
void expect_overflow_skipped(int ranks, int64_t replicas, int overflow_rank) {
  SCOPED_TRACE(std::to_string(ranks) + " ranks, overflow on rank " + std::to_string(overflow_rank));
  const testing::Launch launch = testing::launch_workers(
      ranks, "--tied 1 --scaler 1 --optimizer-steps 4 --overflow-step 1 --overflow-rank " +
                 std::to_string(overflow_rank) + " --data-parallel " + std::to_string(replicas));
  ASSERT_EQ(launch.exit_code, 0) << launch.output;
  const std::vector<bool> stepped{true, false, true, true};
  const std::vector<double> scales{1024, 512, 512, 1024};
  for (int r = 0; r < ranks; ++r) {
    const auto log = read_log(launch.dir, r);
    ASSERT_EQ(log.size(), 4u) << "rank " << r;
    for (size_t k = 0; k < log.size(); ++k) {
      EXPECT_EQ(log[k].stepped, stepped[k]) << "rank " << r << ", step " << k;
      EXPECT_EQ(log[k].scale, scales[k]) << "rank " << r << ", step " << k;
    }
  }
  PlainTraining plain = train_plain(4, 0, 4, /*skipped=*/{1});
  const int64_t S = ranks / replicas;
  const std::vector<int64_t> balance = testing::distributed_balance(S);
  for (int64_t d = 0; d < replicas; ++d) {
    for (int64_t s = 0; s < S; ++s) {
      const auto params = load(launch.dir + "/params_stage" + std::to_string(s) + "_replica" +
                               std::to_string(d) + ".pt");
      const auto expected = stage_parameters(plain.model, balance, s);
      for (size_t k = 0; k < params.size(); ++k) {
        EXPECT_TRUE(close(params[k], expected[k].detach()))
            << "stage " << s << ", replica " << d << ", parameter " << k;
      }
    }
  }
}

TEST(DistributedRecipesTest, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  expect_overflow_skipped(2, 1, 1);
  expect_overflow_skipped(4, 2, 3);  // the second rank of the second replica
}

// Under CPU autocast (bfloat16) every layer on every rank sees what the plain model's layer sees,
// recomputations too, and the gradients are the plain model's on the same micro-batches.
TEST(DistributedRecipesTest, AutocastOnTwoRanks) {
  for (const auto& [schedule, checkpoint] :
       std::vector<std::pair<std::string, std::string>>{{"1f1b", "always"}, {"zb1p", "never"}}) {
    SCOPED_TRACE(schedule + ", checkpoint " + checkpoint);
    const testing::Launch launch =
        testing::launch_workers(2, "--precision bf16 --optimizer-steps 1 --schedule " + schedule +
                                       " --checkpoint " + checkpoint);
    ASSERT_EQ(launch.exit_code, 0) << launch.output;
    std::vector<int64_t> balance = testing::distributed_balance(2);
    auto plain = testing::distributed_model(balance, -1, "", false, false, /*recording=*/true);
    auto [input, target] = testing::distributed_batch();
    testing::take_dtype_log();
    const auto step =
        testing::plain_step(plain, input.to(torch::kFloat), target.to(torch::kFloat), 4, true);
    std::set<std::string> expected, seen;
    for (const auto& [layer, whats] : testing::take_dtype_log()) {
      for (const auto& what : whats) expected.insert(std::to_string(layer) + ": " + what);
    }
    bool recomputed = false;
    for (int r = 0; r < 2; ++r) {
      std::ifstream in(launch.dir + "/dtypes_rank" + std::to_string(r) + ".txt");
      for (std::string line; std::getline(in, line);) {
        const std::string suffix = " (recomputed)";
        if (line.size() > suffix.size() &&
            line.compare(line.size() - suffix.size(), suffix.size(), suffix) == 0) {
          recomputed = true;
          line.resize(line.size() - suffix.size());
        }
        seen.insert(line);
      }
    }
    EXPECT_EQ(seen, expected);
    EXPECT_EQ(recomputed, checkpoint != "never");
    // The gradients before the optimizer's step: within float32 rounding of the plain model's.
    size_t next = 0;
    for (int64_t s = 0; s < 2; ++s) {
      const auto grads = load(launch.dir + "/unclipped_stage" + std::to_string(s) + "_replica0.pt");
      for (const auto& grad : grads) {
        EXPECT_LE(testing::relative_difference(grad, step.grads[next]), 1e-5)
            << "stage " << s << ", parameter " << next;
        ++next;
      }
    }
    EXPECT_EQ(next, step.grads.size());
  }
}

}  // namespace
}  // namespace distributed_recipes_test
}  // namespace distributed
}  // namespace gpipe

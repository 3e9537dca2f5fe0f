#include "test_util.h"

#include "gpipe/balance/balance.h"
#include "gpipe/balance/block_partition.h"
#include "gpipe/balance/profile.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>
#include <thread>

namespace gpipe {
namespace balance_test {
namespace {

using balance::balance_by_count;
using balance::balance_by_size;
using balance::balance_by_time;
using balance::BalanceBySizeOptions;
using balance::BalanceByTimeOptions;
using balance::block_partition;

int64_t largest_block(const std::vector<int64_t>& costs, const std::vector<int64_t>& sizes) {
  int64_t largest = 0;
  size_t begin = 0;
  for (const int64_t size : sizes) {
    int64_t block = 0;
    for (int64_t k = 0; k < size; ++k) block += costs[begin++];
    largest = std::max(largest, block);
  }
  return largest;
}

// Every split of costs into `partitions` non-empty blocks: the smallest largest block, and the
// lexicographically largest sizes reaching it.
std::vector<int64_t> brute_force(const std::vector<int64_t>& costs, int64_t partitions) {
  std::vector<int64_t> best;
  int64_t best_cost = 0;
  std::vector<int64_t> sizes;
  std::function<void(int64_t)> visit = [&](int64_t left) {
    if (static_cast<int64_t>(sizes.size()) == partitions - 1) {
      sizes.push_back(left);
      const int64_t cost = largest_block(costs, sizes);
      if (best.empty() || cost < best_cost || (cost == best_cost && sizes > best)) {
        best = sizes;
        best_cost = cost;
      }
      sizes.pop_back();
      return;
    }
    const int64_t blocks_after = partitions - static_cast<int64_t>(sizes.size()) - 1;
    for (int64_t size = 1; size <= left - blocks_after; ++size) {
      sizes.push_back(size);
      visit(left - size);
      sizes.pop_back();
    }
  };
  visit(static_cast<int64_t>(costs.size()));
  return best;
}

TEST(BlockPartitionTest, Reference) {
  EXPECT_EQ(block_partition({1, 2, 3, 4, 5, 6}, 2), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(block_partition({1, 2, 3, 4, 5, 6}, 1), (std::vector<int64_t>{6}));
  EXPECT_EQ(block_partition({1, 2, 3, 4, 5, 6}, 6), (std::vector<int64_t>{1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(block_partition({1, 2, 3, 4, 5, 6}, 3), (std::vector<int64_t>{3, 2, 1}));  // 6 9 6
}

TEST(BlockPartitionTest, Zeros) {
  EXPECT_EQ(block_partition({0, 0}, 2), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(block_partition({0, 0, 0, 0}, 3), (std::vector<int64_t>{2, 1, 1}));
}

TEST(BlockPartitionTest, BetterThanReferenceHeuristic) {
  // torchgpipe's heuristic stops at [1, 1, 3] (largest 100); the optimum is 51.
  EXPECT_EQ(block_partition({100, 1, 1, 1, 1}, 2), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(largest_block({50, 50, 1, 1, 1}, block_partition({50, 50, 1, 1, 1}, 2)), 53);
}

TEST(BlockPartitionTest, OptimalAsBruteForce) {
  std::mt19937_64 random(20240601);
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(random() % 12);
    const int64_t partitions = 1 + static_cast<int64_t>(random() % std::min<int64_t>(n, 6));
    const int64_t range = trial % 2 ? 4 : 1000;  // few values: many ties
    std::vector<int64_t> costs(static_cast<size_t>(n));
    for (auto& cost : costs) cost = static_cast<int64_t>(random() % range);
    const auto expected = brute_force(costs, partitions);
    const auto actual = block_partition(costs, partitions);
    ASSERT_EQ(actual, expected) << "costs " << c10::IntArrayRef(costs) << " into " << partitions;
  }
}

TEST(BlockPartitionTest, Errors) {
  GPIPE_EXPECT_THROW_WITH(block_partition({42}, 0), c10::ValueError,
                          "partitions must be a positive integer (0 < 1)");
  GPIPE_EXPECT_THROW_WITH(block_partition({42}, -1), c10::ValueError,
                          "partitions must be a positive integer (-1 < 1)");
  GPIPE_EXPECT_THROW_WITH(block_partition({}, 1), c10::ValueError,
                          "sequence is shorter than intended partitions (0 < 1)");
  GPIPE_EXPECT_THROW_WITH(block_partition({42}, 2), c10::ValueError,
                          "sequence is shorter than intended partitions (1 < 2)");
  GPIPE_EXPECT_THROW_WITH(block_partition({1, -3}, 1), c10::ValueError, "costs[1] = -3");
  GPIPE_EXPECT_THROW_WITH(block_partition({INT64_MAX, 1}, 1), c10::ValueError, "overflows");
}

// Sleeps, then returns its input: a layer of known cost.
struct DelayImpl : torch::nn::Cloneable<DelayImpl> {
  explicit DelayImpl(double seconds) : seconds(seconds) {}
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    return x;
  }
  double seconds;
};
TORCH_MODULE(Delay);

TEST(BalanceTest, ByCount) {
  EXPECT_EQ(balance_by_count(3, 8), (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(balance_by_count(2, 16), (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(balance_by_count(4, 4), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(balance_by_count(1, 5), (std::vector<int64_t>{5}));
  GPIPE_EXPECT_THROW_WITH(balance_by_count(0, 5), c10::ValueError,
                          "partitions must be a positive integer (0 < 1)");
  GPIPE_EXPECT_THROW_WITH(balance_by_count(3, 2), c10::ValueError,
                          "sequence is shorter than intended partitions (2 < 3)");
}

TEST(BalanceTest, ByTime) {
  torch::nn::Sequential model;
  for (int k = 1; k <= 6; ++k) model->push_back(Delay(k / 100.0));
  const auto balance =
      balance_by_time(2, model, torch::rand({1}), BalanceByTimeOptions().timeout(0).repetitions(2));
  EXPECT_EQ(balance, (std::vector<int64_t>{4, 2}));

  torch::nn::Sequential reversed;
  for (int k = 6; k >= 1; --k) reversed->push_back(Delay(k / 100.0));
  EXPECT_EQ(balance_by_time(2, reversed, torch::rand({1}), BalanceByTimeOptions().timeout(0)),
            (std::vector<int64_t>{2, 4}));
}

// Counts its forward calls.
struct Count : torch::nn::Module {
  explicit Count(int* calls) : calls(calls) {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++*calls;
    return x;
  }
  int* calls;
};

TEST(BalanceTest, ByTimeRepetitionsAndTimeout) {
  int calls = 0;
  torch::nn::Sequential model(std::make_shared<Count>(&calls));
  balance::profile_times(model, torch::rand({1}), BalanceByTimeOptions().timeout(0).repetitions(3));
  EXPECT_EQ(calls, 3);
  calls = 0;
  const auto begun = std::chrono::steady_clock::now();
  balance::profile_times(model, torch::rand({1}), BalanceByTimeOptions().timeout(0.05));
  EXPECT_GE(std::chrono::steady_clock::now() - begun, std::chrono::milliseconds(50));
  EXPECT_GT(calls, 3);
  GPIPE_EXPECT_THROW_WITH(
      balance::profile_times(model, torch::rand({1}), BalanceByTimeOptions().repetitions(0)),
      c10::ValueError, "repetitions: 0");
  GPIPE_EXPECT_THROW_WITH(
      balance::profile_times(model, torch::rand({1}), BalanceByTimeOptions().timeout(-1)),
      c10::ValueError, "timeout: -1");
}

struct FlattenImpl : torch::nn::Cloneable<FlattenImpl> {
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) { return x.flatten(1); }
};
TORCH_MODULE(Flatten);

TEST(BalanceTest, ByTimeLoopResetsInput) {
  // A second pass would fail if it started from the first pass's output.
  torch::nn::Sequential model(torch::nn::Conv2d(3, 2, 1), Flatten(), torch::nn::Linear(128, 10));
  const auto balance = balance_by_time(2, model, torch::rand({10, 3, 8, 8}),
                                       BalanceByTimeOptions().timeout(0).repetitions(3));
  ASSERT_EQ(balance.size(), 2u);
  EXPECT_EQ(balance[0] + balance[1], 3);
}

// Name, value, requires_grad and grad of every parameter and buffer, and every module's mode.
struct Snapshot {
  explicit Snapshot(torch::nn::Module& module) {
    for (const auto& item : module.named_parameters()) {
      tensors.emplace_back(item.key(), item.value().detach().clone());
      grads.push_back(item.value().grad().defined());
      requires_grad.push_back(item.value().requires_grad());
    }
    for (const auto& item : module.named_buffers()) {
      tensors.emplace_back(item.key(), item.value().clone());
    }
    for (const auto& item : module.named_modules()) modes.push_back(item.value()->is_training());
  }
  void expect_same(torch::nn::Module& module) const {
    const Snapshot now(module);
    ASSERT_EQ(now.tensors.size(), tensors.size());
    for (size_t k = 0; k < tensors.size(); ++k) {
      EXPECT_EQ(now.tensors[k].first, tensors[k].first);
      EXPECT_TRUE(testing::bitwise_equal(now.tensors[k].second, tensors[k].second))
          << tensors[k].first;
      EXPECT_EQ(now.tensors[k].second.device(), tensors[k].second.device()) << tensors[k].first;
    }
    EXPECT_EQ(now.grads, grads);
    EXPECT_EQ(now.requires_grad, requires_grad);
    EXPECT_EQ(now.modes, modes);
  }
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::vector<bool> grads, requires_grad, modes;
};

TEST(BalanceTest, SandboxDuringProfiling) {
  torch::nn::Sequential model(torch::nn::Conv2d(3, 3, 1), torch::nn::BatchNorm2d(3));
  model->eval();
  const Snapshot before(*model);
  balance_by_time(1, model, torch::rand({2, 3, 10, 10}), BalanceByTimeOptions().timeout(0));
  before.expect_same(*model);
  balance_by_size(1, model, torch::rand({2, 3, 10, 10}));
  before.expect_same(*model);
  EXPECT_FALSE(model[1]->is_training());
}

// Not a Cloneable: profiled in place, and restored.
struct InPlaceImpl : torch::nn::Module {
  InPlaceImpl() {
    linear = register_module("linear", torch::nn::Linear(4, 4));
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    seen_training = is_training();
    return bn(linear(x));
  }
  torch::nn::Linear linear{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  bool seen_training = false;
};
TORCH_MODULE(InPlace);

TEST(BalanceTest, SandboxInPlaceForNonCloneable) {
  InPlace layer;
  torch::nn::Sequential model(layer, torch::nn::ReLU());
  model->eval();
  const Snapshot before(*model);
  balance_by_time(2, model, torch::rand({8, 4}), BalanceByTimeOptions().timeout(0));
  EXPECT_TRUE(layer->seen_training);
  before.expect_same(*model);
  layer->seen_training = false;
  balance_by_size(2, model, torch::rand({8, 4}));
  EXPECT_TRUE(layer->seen_training);
  before.expect_same(*model);
}

TEST(BalanceTest, NotTraining) {
  struct AssertTraining : torch::nn::Module {
    torch::Tensor forward(const torch::Tensor& x) {
      EXPECT_TRUE(is_training());
      return x;
    }
  };
  torch::nn::Sequential model(std::make_shared<AssertTraining>());
  model->eval();
  balance_by_time(1, model, torch::rand({1}), BalanceByTimeOptions().timeout(0));
  EXPECT_FALSE(model->is_training());
  EXPECT_FALSE(model[0]->is_training());
}

struct TwinImpl : torch::nn::Cloneable<TwinImpl> {
  void reset() override {}
  std::vector<torch::Tensor> forward(const torch::Tensor& x) { return {x, x.detach()}; }
};
TORCH_MODULE(Twin);

struct AddImpl : torch::nn::Cloneable<AddImpl> {
  void reset() override {}
  torch::Tensor forward(const std::vector<torch::Tensor>& ab) { return ab[0] + ab[1]; }
};
TORCH_MODULE(Add);

TEST(BalanceTest, ByTimeTuple) {
  torch::nn::Sequential model{Twin(), Add()};
  const auto sample = torch::rand({1}, torch::requires_grad());
  EXPECT_EQ(balance_by_time(1, model, sample, BalanceByTimeOptions().timeout(0)),
            (std::vector<int64_t>{2}));
  EXPECT_EQ(balance_by_size(1, model, sample), (std::vector<int64_t>{2}));
  EXPECT_FALSE(sample.grad().defined());  // the sample is copied
}

TEST(BalanceTest, AlreadyHasGrad) {
  torch::nn::Sequential model(torch::nn::Conv2d(3, 3, 1));
  const auto sample = torch::rand({1, 3, 32, 32});
  model->forward(sample).norm().backward();
  GPIPE_EXPECT_THROW_WITH(balance_by_time(1, model, sample), c10::ValueError,
                          "some parameter already has gradient");
}

TEST(BalanceTest, PartitionErrorsBeforeProfiling) {
  int calls = 0;
  torch::nn::Sequential model(std::make_shared<Count>(&calls));
  GPIPE_EXPECT_THROW_WITH(balance_by_time(0, model, torch::rand({1})), c10::ValueError,
                          "partitions must be a positive integer (0 < 1)");
  GPIPE_EXPECT_THROW_WITH(balance_by_time(2, model, torch::rand({1})), c10::ValueError,
                          "sequence is shorter than intended partitions (1 < 2)");
  GPIPE_EXPECT_THROW_WITH(balance_by_size(2, model, torch::rand({1})), c10::ValueError,
                          "sequence is shorter than intended partitions (1 < 2)");
  EXPECT_EQ(calls, 0);
}

// Adds `times` fresh tensors requiring grad: each stays alive in the graph.
struct ExpandImpl : torch::nn::Cloneable<ExpandImpl> {
  explicit ExpandImpl(int times) : times(times) {}
  void reset() override {}
  torch::Tensor forward(torch::Tensor x) {
    for (int k = 0; k < times; ++k) x = x + torch::rand_like(x).requires_grad_();
    return x;
  }
  int times;
};
TORCH_MODULE(Expand);

TEST(BalanceTest, BySizeLatent) {
  const auto sample = torch::rand({10, 100, 100});
  torch::nn::Sequential model;
  for (int k = 1; k <= 6; ++k) model->push_back(Expand(k));
  const auto sizes = balance::profile_sizes(model, sample);
  const int64_t activation = 10 * 100 * 100 * 4;
  for (int k = 0; k < 6; ++k) EXPECT_EQ(sizes[k], (k + 2) * activation) << k;  // k+1 adds, output
  EXPECT_EQ(balance_by_size(2, model, sample), (std::vector<int64_t>{4, 2}));

  torch::nn::Sequential reversed;
  for (int k = 6; k >= 1; --k) reversed->push_back(Expand(k));
  EXPECT_EQ(balance_by_size(2, reversed, sample), (std::vector<int64_t>{2, 4}));

  // Chunks: activations of the first micro-batch only.
  EXPECT_EQ(balance::profile_sizes(model, sample, BalanceBySizeOptions().chunks(5))[0],
            2 * activation / 5);
}

// On a GPU the caching allocator measures, in whole 512-byte blocks: 400,000 bytes take 400,384.
TEST(BalanceTest, BySizeLatentOnCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  const auto sample = torch::rand({10, 100, 100}, torch::kCUDA);
  torch::nn::Sequential model;
  for (int k = 1; k <= 6; ++k) model->push_back(Expand(k));
  model->to(torch::kCUDA);
  const auto sizes = balance::profile_sizes(model, sample);
  const int64_t activation = (10 * 100 * 100 * 4 + 511) / 512 * 512;
  for (int k = 0; k < 6; ++k) EXPECT_EQ(sizes[k], (k + 2) * activation) << k;
  EXPECT_EQ(balance_by_size(2, model, sample), (std::vector<int64_t>{4, 2}));
}

TEST(BalanceTest, BySizeParam) {
  torch::nn::Sequential model;
  for (int k = 0; k < 6; ++k) model->push_back(torch::nn::Linear(k + 1, k + 2));
  const auto sizes =
      balance::profile_sizes(model, torch::rand({1, 1}), BalanceBySizeOptions().param_scale(100));
  // Linear(k+1, k+2) has (k+2)^2 floats; its output of k+2 floats and the saved input are small.
  EXPECT_GE(sizes[0], 100 * 4 * 4);
  EXPECT_LE(sizes[0], 100 * 4 * 4 + 64);
  EXPECT_EQ(balance_by_size(2, model, torch::rand({1, 1}), BalanceBySizeOptions().param_scale(100)),
            (std::vector<int64_t>{4, 2}));

  torch::nn::Sequential reversed;
  for (int k = 5; k >= 0; --k) reversed->push_back(torch::nn::Linear(k + 2, k + 1));
  EXPECT_EQ(
      balance_by_size(2, reversed, torch::rand({1, 7}), BalanceBySizeOptions().param_scale(100)),
      (std::vector<int64_t>{2, 4}));
}

struct TradeoffImpl : torch::nn::Cloneable<TradeoffImpl> {
  TradeoffImpl(int param_size, int latent_size) : param_size(param_size), latent_size(latent_size) {
    reset();
  }
  void reset() override { fc = register_module("fc", torch::nn::Linear(param_size, param_size)); }
  torch::Tensor forward(torch::Tensor x) {
    for (int k = 0; k < latent_size; ++k) x = x + torch::rand_like(x).requires_grad_();
    return x;
  }
  int param_size, latent_size;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Tradeoff);

TEST(BalanceTest, BySizeParamScale) {
  torch::nn::Sequential model;
  for (int k = 1; k <= 6; ++k) model->push_back(Tradeoff(k, 7 - k));
  const auto sample = torch::rand({1}, torch::requires_grad());
  EXPECT_EQ(balance_by_size(2, model, sample, BalanceBySizeOptions().param_scale(0)),
            (std::vector<int64_t>{2, 4}));
  // Parameters of k^2 + k floats dominate: 28000 bytes (x100) in the first five layers, 16800
  // in the last (torchgpipe's CUDA byte counts, rounded to 512-byte blocks, gave [4, 2]).
  EXPECT_EQ(balance_by_size(2, model, sample, BalanceBySizeOptions().param_scale(100)),
            (std::vector<int64_t>{5, 1}));
}

}  // namespace
}  // namespace balance_test
}  // namespace gpipe

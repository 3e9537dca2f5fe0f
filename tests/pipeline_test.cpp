// Ports torchgpipe's tests/test_pipeline.py, plus checks of the pipeline's backward order,
// checkpointing, exceptions and equivalence with the plain model.
#include "test_util.h"

#include "detail/device_thread.h"
#include "detail/stream.h"
#include "gpipe/checkpoint.h"
#include "pipeline/pipeline.h"

#include <torch/torch.h>

#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

namespace gpipe {
namespace pipeline_test {
namespace {

using detail::DeviceThread;
using detail::Pipeline;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const c10::Device kCpu(c10::kCPU);
const c10::Stream kCpuStream(c10::Stream::DEFAULT, kCpu);

using Clocks = std::vector<std::vector<Cell>>;
using Logged = std::pair<int, int>;  // (micro-batch, partition)

TEST(PipelineTest, ClockCycles) {
  EXPECT_EQ(clock_cycles(1, 1), (Clocks{{{0, 0}}}));
  EXPECT_EQ(clock_cycles(1, 3), (Clocks{{{0, 0}}, {{0, 1}}, {{0, 2}}}));
  EXPECT_EQ(clock_cycles(3, 1), (Clocks{{{0, 0}}, {{1, 0}}, {{2, 0}}}));

  EXPECT_EQ(clock_cycles(3, 3), (Clocks{
                                    {{0, 0}},
                                    {{1, 0}, {0, 1}},
                                    {{2, 0}, {1, 1}, {0, 2}},
                                    {{2, 1}, {1, 2}},
                                    {{2, 2}},
                                }));

  EXPECT_EQ(clock_cycles(4, 2), (Clocks{
                                    {{0, 0}},
                                    {{1, 0}, {0, 1}},
                                    {{2, 0}, {1, 1}},
                                    {{3, 0}, {2, 1}},
                                    {{3, 1}},
                                }));
}

TEST(PipelineTest, ClockCyclesEdges) {
  EXPECT_TRUE(clock_cycles(0, 3).empty());
  EXPECT_TRUE(clock_cycles(3, 0).empty());
  // Every cell exactly once, m + n - 1 clocks, i + j == k within clock k.
  for (size_t m = 1; m <= 5; ++m) {
    for (size_t n = 1; n <= 5; ++n) {
      Clocks clocks = clock_cycles(m, n);
      ASSERT_EQ(clocks.size(), m + n - 1);
      std::set<std::pair<size_t, size_t>> cells;
      for (size_t k = 0; k < clocks.size(); ++k) {
        for (const Cell& cell : clocks[k]) {
          EXPECT_EQ(cell.microbatch + cell.partition, k);
          EXPECT_TRUE(cells.insert({cell.microbatch, cell.partition}).second);
        }
      }
      EXPECT_EQ(cells.size(), m * n);
    }
  }
}

TEST(PipelineTest, CellPrints) {
  std::ostringstream out;
  out << Cell{2, 1};
  EXPECT_EQ(out.str(), "(2,1)");
}

// Workers and streams for CPU partitions.
struct CpuPipeline {
  explicit CpuPipeline(size_t partitions, bool shared_worker = false) {
    for (size_t j = 0; j < (shared_worker ? 1 : partitions); ++j) {
      owned.push_back(std::make_unique<DeviceThread>(kCpu));
    }
    for (size_t j = 0; j < partitions; ++j) {
      workers.push_back(owned[shared_worker ? 0 : j].get());
    }
  }

  void run(std::vector<Batch>& batches, std::vector<torch::nn::Sequential>& partitions,
           size_t checkpoint_stop = 0) {
    const size_t n = partitions.size();
    std::vector<c10::Device> devices(n, kCpu);
    std::vector<std::vector<c10::Stream>> copy_streams(
        n, std::vector<c10::Stream>(batches.size(), kCpuStream));
    Pipeline(batches, partitions, devices, copy_streams, workers, checkpoint_stop).run();
  }

  std::vector<std::unique_ptr<DeviceThread>> owned;
  std::vector<DeviceThread*> workers;
};

// A thread-safe log of cells.
struct Timeline {
  void add(int i, int j) {
    std::lock_guard<std::mutex> lock(mutex);
    cells.emplace_back(i, j);
  }
  std::vector<Logged> get() {
    std::lock_guard<std::mutex> lock(mutex);
    return cells;
  }
  // Also logs the cell in `events`, tagged with `kind`.
  void add(char kind, int i, int j) {
    std::lock_guard<std::mutex> lock(mutex);
    cells.emplace_back(i, j);
    events.emplace_back(kind, i, j);
  }
  std::vector<std::tuple<char, int, int>> get_events() {
    std::lock_guard<std::mutex> lock(mutex);
    return events;
  }
  std::mutex mutex;
  std::vector<Logged> cells;                       // guarded by mutex
  std::vector<std::tuple<char, int, int>> events;  // guarded by mutex
};

// torchgpipe's DelayedLog: sleeps, then logs (calls so far, j).
struct DelayedLogImpl : torch::nn::Module {
  DelayedLogImpl(Timeline* timeline, int j, std::chrono::milliseconds delay)
      : timeline(timeline), j(j), delay(delay) {}
  torch::Tensor forward(torch::Tensor x) {
    std::this_thread::sleep_for(delay);
    timeline->add(i++, j);
    return x;
  }
  Timeline* timeline;
  int i = 0;
  int j;
  std::chrono::milliseconds delay;
};
TORCH_MODULE(DelayedLog);

void test_forward_lockstep(bool shared_worker) {
  Timeline timeline;
  std::vector<Batch> batches;
  for (int k = 0; k < 3; ++k) batches.emplace_back(torch::rand({1, 1}));
  std::vector<torch::nn::Sequential> partitions{
      torch::nn::Sequential(DelayedLog(&timeline, 0, std::chrono::milliseconds(0))),
      torch::nn::Sequential(DelayedLog(&timeline, 1, std::chrono::milliseconds(100)))};

  CpuPipeline(2, shared_worker).run(batches, partitions);

  // Expected timeline (logs are recorded at !):
  //
  //   Partition #0: 0! 1!   2!
  //   Partition #1:    000! 111! 222!
  EXPECT_EQ(timeline.get(), (std::vector<Logged>{{0, 0}, {1, 0}, {0, 1}, {2, 0}, {1, 1}, {2, 1}}));
}

TEST(PipelineTest, ForwardLockstep) { test_forward_lockstep(/*shared_worker=*/false); }

TEST(PipelineTest, ForwardLockstepSharedWorker) {
  // As torchgpipe, which shares one worker between partitions on one device.
  test_forward_lockstep(/*shared_worker=*/true);
}

TEST(PipelineTest, ForwardOverlapsPartitions) {
  // With a worker per partition, the cells of one clock run at once: 3 micro-batches over 2
  // partitions of 100 ms each take 4 clocks of ~100 ms, not 6 cells of 100 ms.
  Timeline timeline;
  std::vector<Batch> batches;
  for (int k = 0; k < 3; ++k) batches.emplace_back(torch::rand({1, 1}));
  std::vector<torch::nn::Sequential> partitions{
      torch::nn::Sequential(DelayedLog(&timeline, 0, std::chrono::milliseconds(100))),
      torch::nn::Sequential(DelayedLog(&timeline, 1, std::chrono::milliseconds(100)))};
  const auto start = std::chrono::steady_clock::now();
  CpuPipeline(2).run(batches, partitions);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::milliseconds(550));
  EXPECT_EQ(timeline.get().size(), 6u);
}

TEST(PipelineTest, OutputsReplaceBatches) {
  std::vector<Batch> batches;
  for (int k = 0; k < 4; ++k) batches.emplace_back(torch::full({1, 2}, static_cast<float>(k)));
  std::vector<torch::nn::Sequential> partitions{
      torch::nn::Sequential(torch::nn::Functional([](torch::Tensor x) { return x + 1; })),
      torch::nn::Sequential(torch::nn::Functional([](torch::Tensor x) { return x * 10; }))};
  CpuPipeline(2).run(batches, partitions);
  ASSERT_EQ(batches.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(batches[k].atomic());
    EXPECT_TRUE(torch::equal(batches[k].tensor(), torch::full({1, 2}, (k + 1) * 10.0f))) << k;
  }
}

// Splits a batch into (x, 2x) and merges it back: lists flow between partitions.
struct SplitImpl : torch::nn::Module {
  std::vector<torch::Tensor> forward(torch::Tensor x) { return {x, x * 2}; }
};
TORCH_MODULE(Split);
struct MergeImpl : torch::nn::Module {
  torch::Tensor forward(std::vector<torch::Tensor> xs) { return xs.at(0) + xs.at(1); }
};
TORCH_MODULE(Merge);

TEST(PipelineTest, ListBatchesBetweenPartitions) {
  for (size_t checkpoint_stop : {0u, 3u}) {
    SCOPED_TRACE(checkpoint_stop);
    torch::Tensor x = torch::rand({3, 2}, torch::requires_grad());
    std::vector<Batch> batches = scatter(Batch(x), 3);
    std::vector<torch::nn::Sequential> partitions{torch::nn::Sequential(Split{}),
                                                  torch::nn::Sequential(Merge{})};
    CpuPipeline(2).run(batches, partitions, checkpoint_stop);
    Batch output = gather(batches);
    ASSERT_TRUE(output.atomic());
    EXPECT_TRUE(torch::allclose(output.tensor(), x * 3));
    output.tensor().sum().backward();
    EXPECT_TRUE(torch::allclose(x.grad(), torch::full({3, 2}, 3.0f)));
  }
}

// The backbone: the pipelined model computes the plain model's output and gradients.
TEST(PipelineTest, EquivalentToPlainModel) {
  torch::manual_seed(0);
  torch::nn::Linear first(4, 8), second(8, 8), third(8, 3);
  torch::Tensor input = torch::randn({8, 4});

  auto plain_forward = [&](const torch::Tensor& x) {
    return third(torch::tanh(second(torch::relu(first(x)))));
  };
  auto parameters = [&] {
    std::vector<torch::Tensor> all;
    for (auto* module : std::vector<torch::nn::Module*>{first.get(), second.get(), third.get()}) {
      for (const auto& p : module->parameters()) all.push_back(p);
    }
    return all;
  };
  auto zero_grads = [&] {
    for (auto& p : parameters()) p.mutable_grad() = torch::Tensor();
  };

  torch::Tensor x = input.clone().requires_grad_(true);
  torch::Tensor expected = plain_forward(x);
  (expected * expected).sum().backward();
  std::vector<torch::Tensor> expected_grads{x.grad().clone()};
  for (auto& p : parameters()) expected_grads.push_back(p.grad().clone());

  for (size_t checkpoint_stop : {0u, 2u, 4u}) {
    SCOPED_TRACE(checkpoint_stop);
    zero_grads();
    std::vector<torch::nn::Sequential> partitions{
        torch::nn::Sequential(
            first, torch::nn::Functional([](torch::Tensor x) { return torch::relu(x); })),
        torch::nn::Sequential(
            second, torch::nn::Functional([](torch::Tensor x) { return torch::tanh(x); })),
        torch::nn::Sequential(third)};

    torch::Tensor px = input.clone().requires_grad_(true);
    std::vector<Batch> batches = scatter(Batch(px), 4);
    CpuPipeline(3).run(batches, partitions, checkpoint_stop);
    torch::Tensor actual = gather(batches).tensor();
    EXPECT_TRUE(torch::allclose(actual, expected, 1e-5, 1e-6));

    (actual * actual).sum().backward();
    std::vector<torch::Tensor> actual_grads{px.grad()};
    for (auto& p : parameters()) actual_grads.push_back(p.grad());
    ASSERT_EQ(actual_grads.size(), expected_grads.size());
    for (size_t k = 0; k < actual_grads.size(); ++k) {
      ASSERT_TRUE(actual_grads[k].defined()) << "gradient " << k;
      EXPECT_TRUE(torch::allclose(actual_grads[k], expected_grads[k], 1e-5, 1e-6))
          << "gradient " << k;
    }
  }
}

// Logs (micro-batch, partition) when its backward runs.
struct LogBackward : torch::autograd::Function<LogBackward> {
  static torch::Tensor forward(AutogradContext* ctx, Timeline* timeline, int64_t i, int64_t j,
                               const torch::Tensor& x) {
    ctx->saved_data["timeline"] = reinterpret_cast<int64_t>(timeline);
    ctx->saved_data["i"] = i;
    ctx->saved_data["j"] = j;
    return x.detach();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto* timeline = reinterpret_cast<Timeline*>(ctx->saved_data["timeline"].toInt());
    timeline->add('B', static_cast<int>(ctx->saved_data["i"].toInt()),
                  static_cast<int>(ctx->saved_data["j"].toInt()));
    return {torch::Tensor(), torch::Tensor(), torch::Tensor(), grad[0]};
  }
};

// Identity with a LogBackward node. The micro-batch index is the input's value. The node is made
// on a fresh thread whose autograd sequence numbers fall as the micro-batch index rises, so that
// the engine, which prefers higher sequence numbers, would differentiate micro-batch 0 first if
// the pipeline's fork/join edges did not forbid it.
struct BackwardLogImpl : torch::nn::Module {
  BackwardLogImpl(Timeline* timeline, int j, int m) : timeline(timeline), j(j), m(m) {}
  torch::Tensor forward(torch::Tensor x) {
    const int i = static_cast<int>(std::lround(x.flatten()[0].item<float>()));
    if (is_recomputing()) timeline->add('R', i, j);
    torch::Tensor y;
    const at::ThreadLocalState state;  // grad mode as here
    std::thread thread([&] {
      at::ThreadLocalStateGuard guard(state);
      torch::Tensor bump = torch::zeros({1}, torch::requires_grad());
      for (int k = 0; k < (m - i) * 10; ++k) bump = bump + 1;
      y = LogBackward::apply(timeline, i, j, x);
    });
    thread.join();
    return y;
  }
  Timeline* timeline;
  int j;
  int m;
};
TORCH_MODULE(BackwardLog);

// Runs m micro-batches over n BackwardLog partitions; returns the backward ('B') and recompute
// ('R') events in the order they happened.
std::vector<std::tuple<char, int, int>> backward_events(int m, int n, size_t checkpoint_stop) {
  Timeline timeline;
  std::vector<torch::nn::Sequential> partitions;
  for (int j = 0; j < n; ++j) partitions.emplace_back(BackwardLog(&timeline, j, m));
  torch::Tensor x = torch::arange(m, torch::kFloat).view({m, 1}).requires_grad_(true);
  std::vector<Batch> batches = scatter(Batch(x), m);
  CpuPipeline(static_cast<size_t>(n)).run(batches, partitions, checkpoint_stop);
  EXPECT_TRUE(timeline.get_events().empty());
  gather(batches).tensor().sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::ones({m, 1})));
  return timeline.get_events();
}

std::vector<Logged> cells_of(const std::vector<std::tuple<char, int, int>>& events, char kind) {
  std::vector<Logged> cells;
  for (const auto& [k, i, j] : events) {
    if (k == kind) cells.emplace_back(i, j);
  }
  return cells;
}

// Checks where each recomputation happens: after the backward of the next micro-batch on the
// same partition (the fork/join edge precedes the Recompute node), and before its own backward.
void expect_recompute_order(const std::vector<std::tuple<char, int, int>>& events, int m, int n,
                            int checkpoint_stop) {
  auto position = [&events](char kind, int i, int j) {
    return std::find(events.begin(), events.end(), std::make_tuple(kind, i, j)) - events.begin();
  };
  std::vector<Logged> expected_cells;
  for (int i = 0; i < checkpoint_stop; ++i) {
    for (int j = 0; j < n; ++j) expected_cells.emplace_back(i, j);
  }
  std::vector<Logged> recomputed = cells_of(events, 'R');
  std::sort(recomputed.begin(), recomputed.end());
  EXPECT_EQ(recomputed, expected_cells) << "each checkpointed cell is recomputed exactly once";
  for (const auto& [i, j] : expected_cells) {
    EXPECT_LT(position('R', i, j), position('B', i, j)) << "(" << i << "," << j << ")";
    if (i + 1 < m) {
      EXPECT_LT(position('B', i + 1, j), position('R', i, j)) << "(" << i << "," << j << ")";
    }
  }
}

// Checks GPipe's backward order: (i, j) before (i - 1, j) and before (i, j - 1).
void expect_gpipe_backward_order(const std::vector<Logged>& log, int m, int n) {
  ASSERT_EQ(log.size(), static_cast<size_t>(m * n));
  auto position = [&log](int i, int j) {
    return std::find(log.begin(), log.end(), Logged{i, j}) - log.begin();
  };
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      ASSERT_LT(position(i, j), static_cast<long>(log.size())) << "(" << i << "," << j << ")";
      if (i > 0) {
        EXPECT_LT(position(i, j), position(i - 1, j))
            << "micro-batch " << i - 1 << " ran backward on partition " << j << " before "
            << "micro-batch " << i;
      }
      if (j > 0) EXPECT_LT(position(i, j), position(i, j - 1));
    }
  }
  EXPECT_EQ(log.front(), (Logged{m - 1, n - 1}));
  EXPECT_EQ(log.back(), (Logged{0, 0}));
}

TEST(PipelineTest, BackwardOrder) {
  auto events = backward_events(4, 3, /*checkpoint_stop=*/0);
  expect_gpipe_backward_order(cells_of(events, 'B'), 4, 3);
  EXPECT_TRUE(cells_of(events, 'R').empty());
}

TEST(PipelineTest, BackwardOrderCheckpointed) {
  auto events = backward_events(4, 3, /*checkpoint_stop=*/4);
  expect_gpipe_backward_order(cells_of(events, 'B'), 4, 3);
  expect_recompute_order(events, 4, 3, 4);
}

TEST(PipelineTest, BackwardOrderPartlyCheckpointed) {
  auto events = backward_events(4, 2, /*checkpoint_stop=*/2);
  expect_gpipe_backward_order(cells_of(events, 'B'), 4, 2);
  expect_recompute_order(events, 4, 2, 2);
}

// True if `target` is reachable from `root` along next edges.
bool reachable(const std::shared_ptr<torch::autograd::Node>& root,
               const std::shared_ptr<torch::autograd::Node>& target) {
  std::vector<torch::autograd::Node*> stack{root.get()};
  std::unordered_set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == target.get()) return true;
    if (!node || !seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return false;
}

TEST(PipelineTest, DependencyEdges) {
  // Micro-batch i's graph reaches micro-batch i-1's last fork: the edge that orders backward.
  const int m = 3;
  torch::Tensor x = torch::rand({m, 2}, torch::requires_grad());
  std::vector<Batch> batches = scatter(Batch(x), m);
  std::vector<torch::nn::Sequential> partitions{torch::nn::Sequential(torch::nn::Linear(2, 2)),
                                                torch::nn::Sequential(torch::nn::Linear(2, 2))};
  CpuPipeline(2).run(batches, partitions);

  for (int i = 1; i < m; ++i) {
    auto fork_node = batches[i - 1].tensor().grad_fn();
    ASSERT_TRUE(fork_node);
    EXPECT_THAT(fork_node->name(), ::testing::HasSubstr("Fork")) << i - 1;
    EXPECT_TRUE(reachable(batches[i].tensor().grad_fn(), fork_node)) << i;
    // Not the other way round.
    EXPECT_FALSE(reachable(fork_node, batches[i].tensor().grad_fn())) << i;
  }
  // The last micro-batch is forked by no one.
  EXPECT_THAT(batches[m - 1].tensor().grad_fn()->name(),
              ::testing::Not(::testing::HasSubstr("Fork")));
}

// Records whether each forward call is checkpointed, and counts recomputations.
struct DetectImpl : torch::nn::Module {
  explicit DetectImpl(Timeline* checkpointed, Timeline* recomputed)
      : checkpointed(checkpointed), recomputed(recomputed) {}
  torch::Tensor forward(torch::Tensor x) {
    const int i = static_cast<int>(std::lround(x.flatten()[0].item<float>()));
    if (is_recomputing()) {
      recomputed->add(i, 0);
    } else {
      checkpointed->add(i, is_checkpointing() ? 1 : 0);
    }
    return x * 1;
  }
  Timeline* checkpointed;
  Timeline* recomputed;
};
TORCH_MODULE(Detect);

TEST(PipelineTest, CheckpointStop) {
  Timeline checkpointed, recomputed;
  torch::Tensor x = torch::arange(3, torch::kFloat).view({3, 1}).requires_grad_(true);
  std::vector<Batch> batches = scatter(Batch(x), 3);
  std::vector<torch::nn::Sequential> partitions{
      torch::nn::Sequential(Detect(&checkpointed, &recomputed))};
  CpuPipeline(1).run(batches, partitions, /*checkpoint_stop=*/2);

  // Micro-batches 0 and 1 are checkpointed, 2 is not.
  EXPECT_EQ(checkpointed.get(), (std::vector<Logged>{{0, 1}, {1, 1}, {2, 0}}));
  EXPECT_TRUE(recomputed.get().empty());

  gather(batches).tensor().sum().backward();
  // Only the checkpointed ones are recomputed, the later first.
  EXPECT_EQ(recomputed.get(), (std::vector<Logged>{{1, 0}, {0, 0}}));
  EXPECT_TRUE(torch::equal(x.grad(), torch::ones({3, 1})));
}

TEST(PipelineTest, RunsUnderCallersNoGrad) {
  torch::NoGradGuard no_grad;
  for (size_t checkpoint_stop : {0u, 2u}) {
    Timeline checkpointed, recomputed;
    torch::Tensor x = torch::arange(2, torch::kFloat).view({2, 1});
    torch::nn::Linear linear(1, 1);
    std::vector<Batch> batches = scatter(Batch(x), 2);
    std::vector<torch::nn::Sequential> partitions{torch::nn::Sequential(linear),
                                                  torch::nn::Sequential(linear)};
    CpuPipeline(2).run(batches, partitions, checkpoint_stop);
    for (const auto& batch : batches) {
      EXPECT_FALSE(batch.tensor().requires_grad());
      EXPECT_FALSE(batch.tensor().grad_fn());
    }
  }
}

// Logs its cell, then throws c10::ValueError on micro-batch `fail_on`.
struct FailingImpl : torch::nn::Module {
  FailingImpl(Timeline* timeline, int j, int fail_on)
      : timeline(timeline), j(j), fail_on(fail_on) {}
  torch::Tensor forward(torch::Tensor x) {
    const int i = static_cast<int>(std::lround(x.flatten()[0].item<float>()));
    timeline->add(i, j);
    TORCH_CHECK_VALUE(i != fail_on, "partition ", j, " fails on micro-batch ", i);
    return x * 1;
  }
  Timeline* timeline;
  int j;
  int fail_on;
};
TORCH_MODULE(Failing);

TEST(PipelineTest, ExceptionStopsLaterClocks) {
  for (size_t checkpoint_stop : {0u, 3u}) {
    SCOPED_TRACE(checkpoint_stop);
    Timeline timeline;
    std::vector<torch::nn::Sequential> partitions{torch::nn::Sequential(Failing(&timeline, 0, -1)),
                                                  torch::nn::Sequential(Failing(&timeline, 1, 0))};
    torch::Tensor x = torch::arange(3, torch::kFloat).view({3, 1});
    std::vector<Batch> batches = scatter(Batch(x), 3);
    CpuPipeline pipeline(2);

    GPIPE_EXPECT_THROW_WITH(pipeline.run(batches, partitions, checkpoint_stop), c10::ValueError,
                            "partition 1 fails on micro-batch 0");

    // Clock 1 ran to its end ((1,0) beside the failing (0,1)); clock 2 never started.
    std::vector<Logged> cells = timeline.get();
    std::sort(cells.begin(), cells.end());
    EXPECT_EQ(cells, (std::vector<Logged>{{0, 0}, {0, 1}, {1, 0}}));

    // The workers are still usable.
    std::vector<torch::nn::Sequential> fine{torch::nn::Sequential(Failing(&timeline, 0, -1)),
                                            torch::nn::Sequential(Failing(&timeline, 1, -1))};
    std::vector<Batch> again = scatter(Batch(x), 3);
    pipeline.run(again, fine, checkpoint_stop);
    EXPECT_TRUE(torch::equal(gather(again).tensor(), x));
  }
}

TEST(PipelineTest, FirstExceptionOfClockWins) {
  // Both cells of clock 1 fail; the one of the lower partition is rethrown.
  Timeline timeline;
  std::vector<torch::nn::Sequential> partitions{torch::nn::Sequential(Failing(&timeline, 0, 1)),
                                                torch::nn::Sequential(Failing(&timeline, 1, 0))};
  std::vector<Batch> batches = scatter(Batch(torch::arange(2, torch::kFloat).view({2, 1})), 2);
  GPIPE_EXPECT_THROW_WITH(CpuPipeline(2).run(batches, partitions), c10::ValueError,
                          "partition 0 fails on micro-batch 1");
}

// Returns something that is neither a Tensor nor a list of them.
struct ReturnsIntImpl : torch::nn::Module {
  int64_t forward(torch::Tensor x) { return x.numel(); }
};
TORCH_MODULE(ReturnsInt);

TEST(PipelineTest, WrongReturnTypeNamesPartition) {
  std::vector<torch::nn::Sequential> partitions{
      torch::nn::Sequential(torch::nn::Functional([](torch::Tensor x) { return x; })),
      torch::nn::Sequential(ReturnsInt{})};
  std::vector<Batch> batches = scatter(Batch(torch::rand({2, 1})), 2);
  GPIPE_EXPECT_THROW_WITH(CpuPipeline(2).run(batches, partitions), c10::TypeError,
                          "from partition 1");
}

TEST(PipelineTest, CpuToCuda_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(0);
  torch::nn::Linear first(3, 4), second(4, 2);
  second->to(cuda);
  torch::Tensor x = torch::randn({4, 3});
  torch::Tensor expected = second(first(x).to(cuda));

  std::vector<torch::nn::Sequential> partitions{torch::nn::Sequential(first),
                                                torch::nn::Sequential(second)};
  std::vector<Batch> batches = scatter(Batch(x), 2);
  DeviceThread cpu_worker(kCpu), cuda_worker(cuda);
  std::vector<std::vector<c10::Stream>> copy_streams{
      {kCpuStream, kCpuStream}, {detail::new_stream(cuda), detail::new_stream(cuda)}};
  Pipeline(batches, partitions, {kCpu, cuda}, copy_streams, {&cpu_worker, &cuda_worker}, 1).run();
  torch::Tensor actual = gather(batches).tensor();
  ASSERT_TRUE(actual.is_cuda());
  EXPECT_TRUE(torch::allclose(actual, expected, 1e-5, 1e-6));
  actual.sum().backward();
  ASSERT_TRUE(first->weight.grad().defined());
  EXPECT_TRUE(first->weight.grad().device().is_cpu());
}

}  // namespace
}  // namespace pipeline_test
}  // namespace gpipe

// Tests of PipelineSchedule: every schedule gives the loss and gradients of the plain model on
// the full batch; failures in a stage stop the pipeline and come back with their message.
#include "test_util.h"

#include <ATen/Parallel.h>

#include "gpipe/balance/balance.h"
#include "gpipe/schedule/runtime.h"
#include "gpipe/schedule/schedule_file.h"
#include "gpipe/schedule/thread_transport.h"

#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gpipe {
namespace schedule {
namespace schedule_runtime_test {
namespace {

constexpr int64_t kLayers = 16;

// 8 Linear+Tanh pairs of varying widths, in double precision, the same for one seed.
torch::nn::Sequential make_model(int64_t seed) {
  torch::manual_seed(seed);
  const std::vector<int64_t> widths{5, 7, 6, 8, 4, 6, 5, 7, 3};
  torch::nn::Sequential model;
  for (int64_t k = 0; k < kLayers / 2; ++k) {
    model->push_back(torch::nn::Linear(widths[k], widths[k + 1]));
    model->push_back(torch::nn::Tanh());
  }
  model->to(torch::kDouble);
  return model;
}

at::Tensor mse(const Batch& output, const Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

std::vector<int64_t> even_balance(int64_t stages) {
  return balance::balance_by_count(stages, kLayers);
}

bool close(const at::Tensor& actual, const at::Tensor& expected) {
  return actual.defined() && expected.defined() &&
         torch::allclose(actual, expected, /*rtol=*/1e-6, /*atol=*/1e-12);
}

// The plain model's loss and gradients against those of a pipeline of `stages` stages with
// `options`; `what` names the case.
void expect_equivalent(int64_t stages, const PipelineScheduleOptions& options,
                       const std::string& what) {
  torch::manual_seed(1234);
  // 16 rows: up to 8 micro-batches of 2, which DualPipeV on 8 stages needs.
  const at::Tensor input = torch::randn({16, 5}, torch::kDouble);
  const at::Tensor target = torch::randn({16, 3}, torch::kDouble);

  auto plain = make_model(0);
  const at::Tensor expected_loss = torch::mse_loss(plain->forward(input), target);
  expected_loss.backward();

  auto model = make_model(0);
  PipelineSchedule pipe(model, even_balance(stages), mse, options);
  const at::Tensor loss = pipe.step(input, target);
  EXPECT_TRUE(close(loss, expected_loss))
      << what << ": " << loss.item<double>() << " vs " << expected_loss.item<double>();
  const auto expected = plain->named_parameters();
  const auto actual = model->named_parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& parameter : expected) {
    EXPECT_TRUE(close(actual[parameter.key()].grad(), parameter.value().grad()))
        << what << ": gradient of " << parameter.key();
  }
}

void expect_equivalent(ScheduleKind kind, int64_t stages, int64_t chunks,
                       int64_t stages_per_worker = 1,
                       CheckpointMode checkpoint = CheckpointMode::kNever) {
  expect_equivalent(
      stages,
      PipelineScheduleOptions(chunks)
          .schedule(kind)
          .stages_per_worker(stages_per_worker)
          .checkpoint(checkpoint),
      c10::str(kind, ", ", stages, " stages, ", chunks, " chunks, checkpoint ", checkpoint));
}

TEST(ScheduleRuntimeTest, GPipeEqualsPlainModel) {
  for (int64_t stages = 1; stages <= 4; ++stages) {
    for (int64_t chunks = 1; chunks <= 8; ++chunks) {
      expect_equivalent(ScheduleKind::kGPipe, stages, chunks);
    }
  }
}

TEST(ScheduleRuntimeTest, OneFOneBEqualsPlainModel) {
  for (int64_t stages = 1; stages <= 4; ++stages) {
    for (int64_t chunks = 1; chunks <= 8; ++chunks) {
      expect_equivalent(ScheduleKind::kOneFOneB, stages, chunks);
    }
  }
}

TEST(ScheduleRuntimeTest, ZeroBubbleEqualsPlainModel) {
  for (int64_t stages = 1; stages <= 4; ++stages) {
    for (int64_t chunks = 1; chunks <= 8; ++chunks) {
      expect_equivalent(ScheduleKind::kZeroBubble, stages, chunks);
    }
  }
}

TEST(ScheduleRuntimeTest, InterleavedOneFOneBEqualsPlainModel) {
  // 1..4 workers with 2 stages each.
  for (int64_t workers = 1; workers <= 4; ++workers) {
    for (int64_t chunks = 1; chunks <= 8; ++chunks) {
      expect_equivalent(ScheduleKind::kInterleavedOneFOneB, 2 * workers, chunks, 2);
    }
  }
}

TEST(ScheduleRuntimeTest, ZbvEqualsPlainModel) {
  // 1..4 workers with 2 stages each in a V.
  for (int64_t workers = 1; workers <= 4; ++workers) {
    for (int64_t chunks = 1; chunks <= 8; ++chunks) {
      expect_equivalent(ScheduleKind::kZeroBubbleV, 2 * workers, chunks, 2);
    }
  }
}

TEST(ScheduleRuntimeTest, DualPipeVEqualsPlainModel) {
  // 1..4 workers with 2 stages each in a V; DualPipeV runs from 2W micro-batches.
  for (int64_t workers = 1; workers <= 4; ++workers) {
    for (int64_t chunks = 2 * workers; chunks <= 8; ++chunks) {
      expect_equivalent(ScheduleKind::kDualPipeV, 2 * workers, chunks, 2);
    }
  }
}

TEST(ScheduleRuntimeTest, VMinAndVHalfEqualPlainModel) {
  // 1..4 workers with 2 stages each in a V, memory-bounded.
  for (const auto kind : {ScheduleKind::kVMin, ScheduleKind::kVHalf}) {
    for (int64_t workers = 1; workers <= 4; ++workers) {
      for (int64_t chunks = 1; chunks <= 8; ++chunks) {
        expect_equivalent(kind, 2 * workers, chunks, 2);
      }
    }
  }
}

// Schedules of one's own, as text (schedule_file.h): hand-written 1F1B with one worker running
// stages 0 and 1 in a V with 2 and 3, and PyTorch's lowered notation.
TEST(ScheduleRuntimeTest, CustomScheduleEqualsPlainModel) {
  const std::vector<std::string> texts{
      "0F0 0F1 0B0 0F2 0B1 0B2\n"
      "1F0 1B0 1F1 1B1 1F2 1B2\n",
      "0F0 0F1 3F0 3B0 3F1 3B1 0B0 0B1\n"
      "1F0 2F0 1F1 2F1 2B0 1B0 2B1 1B1\n",
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0W0,0RECV_B1,0I1,0W1\n"
      "1RECV_F0,1F0,1I0,1SEND_B0,1RECV_F1,1F1,1I1,1SEND_B1,1W0,1W1\n"};
  for (const auto& text : texts) {
    const Schedule custom = parse_schedule(text);
    expect_equivalent(custom.num_stages,
                      PipelineScheduleOptions(custom.num_microbatches).custom_schedule(custom),
                      text);
  }
}

// DualPipeV on 8 stages needs 8 micro-batches; 10 rows in 8 chunks make 5 (chunks of 2).
TEST(ScheduleRuntimeTest, DualPipeVNamesTooFewMicroBatches) {
  const at::Tensor input = torch::randn({10, 5}, torch::kDouble);
  const at::Tensor target = torch::randn({10, 3}, torch::kDouble);
  PipelineSchedule pipe(
      make_model(0), even_balance(8), mse,
      PipelineScheduleOptions(8).schedule(ScheduleKind::kDualPipeV).stages_per_worker(2));
  GPIPE_EXPECT_THROW_WITH(pipe.step(input, target), c10::ValueError,
                          "schedule dualpipev needs at least 8 micro-batches on 8 stages, but this "
                          "step has 5 (chunks, or fewer where the batch is smaller)");
}

TEST(ScheduleRuntimeTest, CustomScheduleMustFitThePipeline) {
  const Schedule custom = parse_schedule("0F0 0F1 0I0 0W0 0I1 0W1\n1F0 1I0 1F1 1I1 1W0 1W1\n");
  const at::Tensor input = torch::randn({10, 5}, torch::kDouble);
  const at::Tensor target = torch::randn({10, 3}, torch::kDouble);
  PipelineSchedule pipe(make_model(0), even_balance(2), mse,
                        PipelineScheduleOptions(3).custom_schedule(custom));
  GPIPE_EXPECT_THROW_WITH(pipe.step(input, target), c10::ValueError,
                          "the custom schedule has 2 micro-batches, but this step has 3");
  GPIPE_EXPECT_THROW_WITH(PipelineSchedule(make_model(0), even_balance(4), mse,
                                           PipelineScheduleOptions(2).custom_schedule(custom)),
                          c10::ValueError,
                          "the custom schedule runs 2 stages on 2 workers, but this pipeline has "
                          "4 stages on 2 workers");
  GPIPE_EXPECT_THROW_WITH(
      PipelineSchedule(
          make_model(0), even_balance(2), mse,
          PipelineScheduleOptions(2).custom_schedule(custom).checkpoint(CheckpointMode::kAlways)),
      c10::ValueError,
      "the custom schedule splits backwards into input and weight gradients, which checkpoint "
      "cannot");
}

TEST(ScheduleRuntimeTest, InterleavedZb1pAndLoopedBfsEqualPlainModel) {
  // 1..4 workers with 2 stages each.
  for (const auto kind : {ScheduleKind::kInterleavedZeroBubble, ScheduleKind::kLoopedBFS}) {
    for (int64_t workers = 1; workers <= 4; ++workers) {
      for (int64_t chunks = 1; chunks <= 8; ++chunks) {
        expect_equivalent(kind, 2 * workers, chunks, 2);
      }
    }
  }
}

TEST(ScheduleRuntimeTest, CheckpointingEqualsPlainModel) {
  for (const auto mode : {CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
    for (const auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
      expect_equivalent(kind, 3, 4, 1, mode);
      expect_equivalent(kind, 2, 1, 1, mode);
    }
    expect_equivalent(ScheduleKind::kInterleavedOneFOneB, 4, 5, 2, mode);
  }
}

TEST(ScheduleRuntimeTest, ExceptLastRecomputesAllButTheLastMicroBatch) {
  for (const auto mode : {CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
    auto tracer = std::make_shared<trace::Tracer>();
    PipelineSchedule pipe(make_model(0), even_balance(2), mse,
                          PipelineScheduleOptions(4).checkpoint(mode).tracer(tracer));
    pipe.step(torch::randn({8, 5}, torch::kDouble), torch::randn({8, 3}, torch::kDouble));
    std::map<int64_t, int> recomputes;  // by micro-batch, over both stages
    for (const auto& e : tracer->events()) {
      if (e.name == "recompute") ++recomputes[e.microbatch];
    }
    const std::map<int64_t, int> expected =
        mode == CheckpointMode::kAlways ? std::map<int64_t, int>{{0, 2}, {1, 2}, {2, 2}, {3, 2}}
                                        : std::map<int64_t, int>{{0, 2}, {1, 2}, {2, 2}};
    EXPECT_EQ(recomputes, expected) << mode;
  }
}

TEST(ScheduleRuntimeTest, GradientsAccumulateAcrossSteps) {
  torch::manual_seed(7);
  const at::Tensor input = torch::randn({6, 5}, torch::kDouble);
  const at::Tensor target = torch::randn({6, 3}, torch::kDouble);
  auto plain = make_model(0);
  for (int k = 0; k < 2; ++k) torch::mse_loss(plain->forward(input), target).backward();
  auto model = make_model(0);
  PipelineSchedule pipe(model, {8, 8}, mse, PipelineScheduleOptions(3));
  for (int k = 0; k < 2; ++k) pipe.step(input, target);
  for (const auto& parameter : plain->named_parameters()) {
    EXPECT_TRUE(close(model->named_parameters()[parameter.key()].grad(), parameter.value().grad()))
        << parameter.key();
  }
}

TEST(ScheduleRuntimeTest, SumReductionIsUnscaled) {
  torch::manual_seed(8);
  const at::Tensor input = torch::randn({7, 5}, torch::kDouble);
  const at::Tensor target = torch::randn({7, 3}, torch::kDouble);
  auto plain = make_model(0);
  const at::Tensor expected = torch::mse_loss(plain->forward(input), target, torch::Reduction::Sum);
  expected.backward();
  auto model = make_model(0);
  PipelineSchedule pipe(
      model, {6, 10},
      [](const Batch& output, const Batch& target) {
        return torch::mse_loss(output.tensor(), target.tensor(), torch::Reduction::Sum);
      },
      PipelineScheduleOptions(4).loss_reduction(LossReduction::kSum));
  EXPECT_TRUE(close(pipe.step(input, target), expected));
  for (const auto& parameter : plain->named_parameters()) {
    EXPECT_TRUE(close(model->named_parameters()[parameter.key()].grad(), parameter.value().grad()))
        << parameter.key();
  }
}

// Stage 0 of the list test: (x, labels) -> (tanh(linear(x)), labels).
struct ListHeadImpl : torch::nn::Module {
  ListHeadImpl() : linear(register_module("linear", torch::nn::Linear(4, 4))) {}
  std::vector<at::Tensor> forward(std::vector<at::Tensor> xs) {
    return {torch::tanh(linear->forward(xs[0])), xs[1]};
  }
  torch::nn::Linear linear;
};
TORCH_MODULE(ListHead);

// Stage 1: linear(x) * (labels + 1).
struct ListTailImpl : torch::nn::Module {
  ListTailImpl() : linear(register_module("linear", torch::nn::Linear(4, 2))) {}
  at::Tensor forward(std::vector<at::Tensor> xs) {
    return linear->forward(xs[0]) * (xs[1].unsqueeze(1).to(torch::kDouble) + 1);
  }
  torch::nn::Linear linear;
};
TORCH_MODULE(ListTail);

TEST(ScheduleRuntimeTest, ListBatchesAndNonFloatTensorsPass) {
  // Integer labels pass from stage to stage and get no gradient.
  torch::manual_seed(9);
  ListHead head;
  ListTail tail;
  head->to(torch::kDouble);
  tail->to(torch::kDouble);
  const at::Tensor x = torch::randn({6, 4}, torch::kDouble);
  const at::Tensor labels = torch::randint(0, 3, {6}, torch::kLong);
  const at::Tensor target = torch::randn({6, 2}, torch::kDouble);
  const at::Tensor expected = torch::mse_loss(tail->forward(head->forward({x, labels})), target);
  expected.backward();
  const at::Tensor expected_grad = head->linear->weight.grad().clone();
  for (const auto kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
    head->zero_grad();
    tail->zero_grad();
    PipelineSchedule pipe({torch::nn::Sequential(head), torch::nn::Sequential(tail)}, mse,
                          PipelineScheduleOptions(3).schedule(kind));
    EXPECT_TRUE(close(pipe.step(Batch(std::vector<at::Tensor>{x, labels}), target), expected));
    EXPECT_TRUE(close(head->linear->weight.grad(), expected_grad)) << kind;
  }
}

TEST(ScheduleRuntimeTest, ExceptionInAStageStopsEveryStage) {
  auto model = make_model(0);
  torch::nn::Sequential broken;
  int64_t k = 0;
  for (const auto& layer : *model) {
    broken->push_back(layer);
    if (k++ == 10) {
      broken->push_back(torch::nn::Functional([](const at::Tensor& x) -> at::Tensor {
        TORCH_CHECK_VALUE(false, "stage failure on purpose");
        return x;
      }));
    }
  }
  const at::Tensor input = torch::randn({8, 5}, torch::kDouble);
  const at::Tensor target = torch::randn({8, 3}, torch::kDouble);
  for (const auto kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
    PipelineSchedule pipe(broken, {4, 4, 5, 4}, mse, PipelineScheduleOptions(4).schedule(kind));
    GPIPE_EXPECT_THROW_WITH(pipe.step(input, target), c10::ValueError, "stage failure on purpose");
    // And again: nothing is left over from the failed step.
    GPIPE_EXPECT_THROW_WITH(pipe.step(input, target), c10::ValueError, "stage failure on purpose");
  }
}

TEST(ScheduleRuntimeTest, LossMustBeAScalar) {
  auto model = make_model(0);
  PipelineSchedule pipe(
      model, {8, 8}, [](const Batch& output, const Batch&) { return output.tensor(); },
      PipelineScheduleOptions(2));
  GPIPE_EXPECT_THROW_WITH(
      pipe.step(torch::randn({4, 5}, torch::kDouble), torch::randn({4, 3}, torch::kDouble)),
      c10::ValueError,
      "the loss function must return a scalar, but returned a tensor of shape [2, 3]");
}

// Counts near the ends of int64_t: exact sums, and never more micro-batches than samples.
TEST(ScheduleRuntimeTest, HugeCounts) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto model = make_model(0);
  GPIPE_EXPECT_THROW_WITH(PipelineSchedule(model, {kMax, kMax, 2}, mse, PipelineScheduleOptions(2)),
                          c10::ValueError,
                          "module and sum of balance have different length (module: 16, sum of "
                          "balance: 18446744073709551616)");
  GPIPE_EXPECT_THROW_WITH(
      PipelineSchedule(model, {8, 8}, mse,
                       PipelineScheduleOptions(2)
                           .schedule(ScheduleKind::kInterleavedOneFOneB)
                           .stages_per_worker(kMax)),
      c10::ValueError,
      "stages_per_worker (9223372036854775807) must divide the number of stages (2)");
  for (const auto kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
    expect_equivalent(kind, 2, kMax);
  }
  expect_equivalent(ScheduleKind::kInterleavedOneFOneB, 4, kMax, 2);
}

TEST(ScheduleRuntimeTest, ChecksArguments) {
  auto model = make_model(0);
  GPIPE_EXPECT_THROW_WITH(PipelineSchedule(model, {4, 3}, mse, PipelineScheduleOptions(2)),
                          c10::ValueError,
                          "module and sum of balance have different length (module: 16, sum of "
                          "balance: 7)");
  GPIPE_EXPECT_THROW_WITH(
      PipelineSchedule(model, {8, 8}, mse, PipelineScheduleOptions(2).stages_per_worker(2)),
      c10::ValueError, "schedule 1f1b runs one stage per worker, but stages_per_worker is 2");
  GPIPE_EXPECT_THROW_WITH(PipelineSchedule(model, {8, 8}, mse, PipelineScheduleOptions(0)),
                          c10::ValueError, "chunks must be positive, but got 0");
  GPIPE_EXPECT_THROW_WITH(PipelineSchedule(model, {4, 4, 8}, mse,
                                           PipelineScheduleOptions(2)
                                               .schedule(ScheduleKind::kInterleavedOneFOneB)
                                               .stages_per_worker(2)),
                          c10::ValueError,
                          "stages_per_worker (2) must divide the number of stages (3)");
  GPIPE_EXPECT_THROW_WITH(
      PipelineSchedule(model, {8, 8}, mse,
                       PipelineScheduleOptions(2)
                           .schedule(ScheduleKind::kZeroBubble)
                           .checkpoint(CheckpointMode::kExceptLast)),
      c10::ValueError,
      "schedule zb1p splits each backward into input and weight gradients, which checkpoint "
      "cannot");
  GPIPE_EXPECT_THROW_WITH(
      PipelineSchedule(
          model, {8, 8}, mse,
          PipelineScheduleOptions(2).schedule(ScheduleKind::kZeroBubble).stages_per_worker(2)),
      c10::ValueError, "schedule zb1p runs one stage per worker, but stages_per_worker is 2");
  PipelineSchedule pipe(model, {8, 8}, mse, PipelineScheduleOptions(2));
  GPIPE_EXPECT_THROW_WITH(
      pipe.step(torch::randn({4, 5}, torch::kDouble), torch::randn({3, 3}, torch::kDouble)),
      c10::ValueError, "the input has 4 and the target 3");
  GPIPE_EXPECT_THROW_WITH(pipe.stage_module(2), c10::IndexError, "stage 2 is out of range");
  EXPECT_EQ(pipe.schedule(3).num_microbatches, 3);
  EXPECT_EQ(pipe.schedule(3).actions, one_f_one_b_schedule(2, 3).actions);
  GPIPE_EXPECT_THROW_WITH(pipe.schedule(0), c10::ValueError,
                          "num_microbatches must be positive, but got 0");
}

TEST(ScheduleRuntimeTest, StagesRunInParallel) {
  // Stage 0 waits until stage 1 has started its first forward: only possible on two threads.
  std::mutex mutex;
  std::condition_variable started;
  bool second_started = false;
  torch::nn::Sequential stage0(torch::nn::Functional([&](const at::Tensor& x) {
    std::unique_lock<std::mutex> lock(mutex);
    if (x.size(0) > 0 && x[0][0].item<double>() == 1.0) {
      // The second micro-batch: wait for stage 1 to be busy with the first.
      EXPECT_TRUE(started.wait_for(lock, std::chrono::seconds(10), [&] { return second_started; }));
    }
    return x * 2;
  }));
  torch::nn::Sequential stage1(torch::nn::Functional([&](const at::Tensor& x) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      second_started = true;
    }
    started.notify_all();
    return x.sum(1, true);
  }));
  const at::Tensor input = torch::tensor({{0.0, 0.0}, {1.0, 1.0}}, torch::kDouble).requires_grad_();
  PipelineSchedule pipe({stage0, stage1}, mse,
                        PipelineScheduleOptions(2).schedule(ScheduleKind::kGPipe));
  pipe.step(input, torch::zeros({2, 1}, torch::kDouble));
  EXPECT_TRUE(second_started);
}

// at::set_num_threads on a worker sets the OpenMP thread count of that thread only: the stages
// see their own count and the calling thread keeps its own.
TEST(ScheduleRuntimeTest, IntraOpThreadsArePerWorker) {
  at::internal::lazy_init_num_threads();
  const int caller = at::get_num_threads();
  for (const int64_t threads : {int64_t{1}, int64_t{2}}) {
    std::mutex mutex;
    std::vector<int> seen;
    auto probe = [&](const at::Tensor& x) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.push_back(at::get_num_threads());
      return x * 1.5;
    };
    PipelineSchedule pipe({torch::nn::Sequential(torch::nn::Functional(probe)),
                           torch::nn::Sequential(torch::nn::Functional(probe))},
                          mse, PipelineScheduleOptions(2).intra_op_threads(threads));
    pipe.step(torch::ones({2, 1}, torch::kDouble).requires_grad_(),
              torch::zeros({2, 1}, torch::kDouble));
    EXPECT_THAT(seen, ::testing::Each(threads));
    EXPECT_EQ(seen.size(), 4u);
    EXPECT_EQ(at::get_num_threads(), caller);
  }
  // The workers also left their count as LibTorch's default for new threads: restore it.
  at::set_num_threads(caller);
}

TEST(ThreadTransportTest, QueuesInOrderAndAborts) {
  ThreadTransport transport(2, 1);
  transport.send(Batch(torch::ones({1})), 0, 1, 0);
  EXPECT_TRUE(gpipe::testing::bitwise_equal(transport.recv(0, 1, 0).tensor(), torch::ones({1})));
  transport.send(Batch(torch::ones({1})), 1, 0, 3);
  GPIPE_EXPECT_THROW_WITH(transport.recv(1, 0, 2), c10::ValueError,
                          "stage 0 expected message 2 from stage 1, but the next one is 3");
  GPIPE_EXPECT_THROW_WITH(transport.send(Batch(torch::ones({1})), 0, 0, 0), c10::IndexError,
                          "no edge from stage 0 to stage 0");
  std::thread waiter(
      [&] { GPIPE_EXPECT_THROW_WITH(transport.recv(0, 1, 5), c10::Error, "transport aborted"); });
  transport.abort();
  waiter.join();
}

}  // namespace
}  // namespace schedule_runtime_test
}  // namespace schedule
}  // namespace gpipe

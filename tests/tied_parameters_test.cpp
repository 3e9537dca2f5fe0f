// Tests of tied parameters (one tensor used by several stages, as a language model's embedding
// and output projection) in the schedule engines on threads: every schedule gives the tie the
// plain model's gradient, parameters() lists it once, and what cannot hold a tie is refused.
// (Ranks: distributed_recipes_test.cpp.)
#include "distributed_model.h"
#include "plain_reference.h"
#include "test_util.h"

#include "gpipe/pipe.h"
#include "gpipe/schedule/runtime.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace gpipe {
namespace schedule {
namespace tied_parameters_test {
namespace {

constexpr size_t kDistributedLayersLast = testing::kDistributedLayers - 1;

at::Tensor mse(const Batch& output, const Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

struct Case {
  ScheduleKind kind;
  int64_t stages_per_worker;
};

const std::vector<Case> kEverySchedule{
    {ScheduleKind::kGPipe, 1},
    {ScheduleKind::kOneFOneB, 1},
    {ScheduleKind::kInterleavedOneFOneB, 2},
    {ScheduleKind::kZeroBubble, 1},
    {ScheduleKind::kInterleavedZeroBubble, 2},
    {ScheduleKind::kLoopedBFS, 2},
    {ScheduleKind::kZeroBubbleV, 2},
    {ScheduleKind::kDualPipeV, 2},
    {ScheduleKind::kVMin, 2},
    {ScheduleKind::kVHalf, 2},
};

// Three SGD steps on parameters(): the tie's gradient sums both stages' parts in every step
// (float64, 1e-12), and so the trained tie equals the plain model's.
TEST(TiedParametersTest, EveryScheduleGivesThePlainModelsGradient) {
  const auto [input, target] = testing::tied_batch();
  auto plain = testing::tied_model();
  const auto plain_parameters = testing::unique(plain->parameters());
  torch::optim::SGD plain_sgd(plain_parameters, 0.1);
  std::vector<std::vector<at::Tensor>> expected_grads;
  for (int step = 0; step < 3; ++step) {
    plain_sgd.zero_grad();
    torch::mse_loss(plain->forward(input), target).backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : plain_parameters) grads.push_back(p.grad().clone());
    expected_grads.push_back(grads);
    plain_sgd.step();
  }
  for (const auto& c : kEverySchedule) {
    for (const int64_t workers : {2, 4}) {
      SCOPED_TRACE(c10::str(c.kind, " on ", workers, " workers"));
      auto model = testing::tied_model();
      const int64_t S = workers * c.stages_per_worker;
      PipelineSchedule pipe(
          model, testing::distributed_balance(S), mse,
          PipelineScheduleOptions(8).schedule(c.kind).stages_per_worker(c.stages_per_worker));
      // LibTorch lists the tie once per module that registers it; parameters() once.
      ASSERT_EQ(model->parameters().size(), plain_parameters.size() + 1);
      const auto parameters = pipe.parameters();
      ASSERT_EQ(parameters.size(), plain_parameters.size());
      torch::optim::SGD sgd(parameters, 0.1);
      for (int step = 0; step < 3; ++step) {
        sgd.zero_grad();
        pipe.step(input, target);
        for (size_t k = 0; k < parameters.size(); ++k) {
          EXPECT_LE(testing::relative_difference(parameters[k].grad(), expected_grads[step][k]),
                    1e-12)
              << "step " << step << ", parameter " << k;
        }
        sgd.step();
      }
      for (size_t k = 0; k < parameters.size(); ++k) {
        EXPECT_LE(testing::relative_difference(parameters[k], plain_parameters[k]), 1e-12)
            << "parameter " << k;
      }
    }
  }
}

// The tie's gradient is added up in one order every run: each worker's parts in its schedule's
// order, then the workers' sums in worker order. Here that is the plain model's with the tie cut
// into two leaves, each getting its stage's parts micro-batch by micro-batch, then added: bitwise.
TEST(TiedParametersTest, TheTiesPartsAddUpInOneOrder) {
  const auto [input, target] = testing::tied_batch();
  auto plain = testing::tied_model();
  auto* head = plain[kDistributedLayersLast]->as<testing::OutputProjectionImpl>();
  head->weight = head->weight.detach().clone().requires_grad_(true);
  const auto inputs = input.chunk(4);
  const auto targets = target.chunk(4);
  for (size_t i = 0; i < inputs.size(); ++i) {
    (torch::mse_loss(plain->forward(inputs[i]), targets[i]) *
     (static_cast<double>(inputs[i].size(0)) / static_cast<double>(input.size(0))))
        .backward();
  }
  const auto expected =
      plain[0]->as<testing::TokenEmbeddingImpl>()->weight.grad() + head->weight.grad();
  for (const auto kind : {ScheduleKind::kOneFOneB, ScheduleKind::kGPipe}) {
    auto model = testing::tied_model();
    PipelineSchedule pipe(model, testing::distributed_balance(2), mse,
                          PipelineScheduleOptions(4).schedule(kind));
    for (int run = 0; run < 20; ++run) {
      model->zero_grad();
      pipe.step(input, target);
      ASSERT_TRUE(testing::bitwise_equal(pipe.parameters().front().grad(), expected))
          << kind << ", run " << run;
    }
  }
}

// A tie is one tensor, on one device: its stages must share it.
TEST(TiedParametersTest, StagesOfATieShareADevice) {
  auto model = testing::tied_model();
  GPIPE_EXPECT_THROW_WITH(
      PipelineSchedule(
          model, testing::distributed_balance(2), mse,
          PipelineScheduleOptions(4).devices({c10::Device(c10::kCPU), c10::Device(c10::kCUDA, 0)})),
      c10::ValueError,
      "parameter '0.weight' is tied across stages 0, 1, which must then share a device, but "
      "stage 0 is on cpu and stage 1 on cuda:0");
}

// GPipe keeps torchgpipe's refusal of parameters shared between partitions.
TEST(TiedParametersTest, GPipeRefusesThem) {
  GPIPE_EXPECT_THROW_WITH(GPipe(testing::tied_model(), GPipeOptions({8, 8})), c10::ValueError,
                          "duplicate parameters in distinct children");
}

}  // namespace
}  // namespace tied_parameters_test
}  // namespace schedule
}  // namespace gpipe

// Stashed tensors are released once popped (and once recomputed): no portal holds a tensor when
// backward is over. Ports tests/skip/test_leak.py.
#include "test_util.h"

#include <gpipe/pipe.h>
#include <gpipe/skip/skippable.h>
#include <gpipe/skip/tracker.h>

#include <torch/csrc/autograd/custom_function.h>

namespace gpipe {
namespace skip {
namespace skip_leak_test {
namespace {

using torch::nn::Sequential;

struct StashImpl : torch::nn::Module, Skippable {
  StashImpl() : Skippable({"skip"}, {}) {}
  torch::Tensor forward(torch::Tensor input) {
    stash("skip", input);
    return input;
  }
};
TORCH_MODULE(Stash);

struct PopImpl : torch::nn::Module, Skippable {
  PopImpl() : Skippable({}, {"skip"}) {}
  torch::Tensor forward(torch::Tensor input) { return input + pop("skip"); }
};
TORCH_MODULE(Pop);

const SkipKey kSkip{Namespace::none(), "skip"};

// The trackers the probe saw, in order; the probe's backward checks its micro-batch's portal.
std::vector<std::shared_ptr<SkipTracker>> probed;
int backward_checks = 0;
// Whether the probe's backward checks a portal: only for models cut across partitions.
bool check_portal_at_backward = true;

// True when the portal of `tracker` is spent: no tensor, no life left.
bool portal_is_spent(const std::shared_ptr<SkipTracker>& tracker) {
  auto through_portals = std::dynamic_pointer_cast<SkipTrackerThroughPortals>(tracker);
  if (!through_portals || through_portals->portals().size() != 1) return false;
  const auto& portal = through_portals->portals().at(kSkip);
  return portal->tensor_life() == 0 && !portal->tensor().defined();
}

// Identity whose backward, the last of its micro-batch, checks that no portal holds a tensor.
struct NoPortalTensorAtBackward : torch::autograd::Function<NoPortalTensorAtBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input) {
    ctx->saved_data["probe"] = static_cast<int64_t>(probed.size());
    probed.push_back(current_skip_tracker());
    return input.detach();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    if (check_portal_at_backward) {
      EXPECT_TRUE(portal_is_spent(probed.at(ctx->saved_data["probe"].toInt())));
      ++backward_checks;
    }
    return grad;
  }
};

struct ProbeImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor input) { return NoPortalTensorAtBackward::apply(input); }
};
TORCH_MODULE(Probe);

class SkipLeakTest : public ::testing::TestWithParam<std::tuple<bool, CheckpointMode>> {
 protected:
  void SetUp() override {
    probed.clear();
    backward_checks = 0;
    check_portal_at_backward = true;
  }
};

class SkipLeakWithoutGPipeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    probed.clear();
    backward_checks = 0;
    check_portal_at_backward = false;
  }
};

TEST_P(SkipLeakTest, DeletePortalTensor) {
  const auto [train, mode] = GetParam();
  // Without checkpointing:          With checkpointing:
  //   Stash: 2, blue -> 1             Stash: 3, blue -> 2       (recomputed) Stash: 1, blue -> 0
  //   Pop: orange -> 0                Pop: orange -> 1          (recomputed) Pop: orange -> 0
  GPipe model(Sequential(Probe(), Stash(), Pop()), GPipeOptions({2, 1}).chunks(2).checkpoint(mode));
  auto input = torch::rand({10}, torch::requires_grad());
  if (train) {
    model->train();
    auto output = model->forward(input);
    // After forward only checkpointed micro-batches keep their tensor, for the recomputation.
    const size_t checkpointed = mode == CheckpointMode::kAlways       ? 2
                                : mode == CheckpointMode::kExceptLast ? 1
                                                                      : 0;
    ASSERT_EQ(probed.size(), 2u);
    for (size_t i = 0; i < probed.size(); ++i) {
      EXPECT_EQ(portal_is_spent(probed[i]), i >= checkpointed) << "micro-batch " << i;
    }
    output.norm().backward();
    EXPECT_EQ(backward_checks, 2);
  } else {
    model->eval();
    torch::NoGradGuard no_grad;
    model->forward(input);
    ASSERT_EQ(probed.size(), 2u);
    for (const auto& tracker : probed) EXPECT_TRUE(portal_is_spent(tracker));
  }
}

INSTANTIATE_TEST_SUITE_P(TrainEvalCheckpoint, SkipLeakTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(CheckpointMode::kAlways,
                                                              CheckpointMode::kExceptLast,
                                                              CheckpointMode::kNever)));

TEST_F(SkipLeakWithoutGPipeTest, NoPortalWithoutGPipe) {
  for (const bool train : {true, false}) {
    probed.clear();
    auto model = Sequential(Probe(), Stash(), Pop());
    auto input = torch::rand({10}, torch::requires_grad());
    if (train) {
      model->train();
      model->forward(input).norm().backward();
    } else {
      model->eval();
      torch::NoGradGuard no_grad;
      model->forward(input);
    }
    ASSERT_EQ(probed.size(), 1u);
    EXPECT_EQ(std::dynamic_pointer_cast<SkipTrackerThroughPortals>(probed[0]), nullptr);
    // The plain tracker gave the tensor to the pop and kept nothing.
    EXPECT_TRUE(probed[0]->tensors().empty());
  }
}

TEST_F(SkipLeakWithoutGPipeTest, NoPortalWithinOnePartition) {
  GPipe model(Sequential(Probe(), Stash(), Pop()), GPipeOptions({3}).chunks(2));
  model->forward(torch::rand({10}, torch::requires_grad())).norm().backward();
  ASSERT_GE(probed.size(), 2u);
  for (const auto& tracker : probed) {
    auto through_portals = std::dynamic_pointer_cast<SkipTrackerThroughPortals>(tracker);
    ASSERT_NE(through_portals, nullptr);
    EXPECT_TRUE(through_portals->portals().empty());
    EXPECT_TRUE(through_portals->tensors().empty());
  }
}

}  // namespace
}  // namespace skip_leak_test
}  // namespace skip
}  // namespace gpipe

// Skip connections under GPipe: gradients equal the plain Sequential's for every balance and
// checkpoint mode. Ports tests/skip/test_gpipe.py and goes further.
#include "gradients.h"
#include "test_util.h"

#include <gpipe/pipe.h>
#include <gpipe/skip/skippable.h>

#include <functional>
#include <unordered_set>

namespace gpipe {
namespace skip {
namespace skip_gpipe_test {
namespace {

using torch::nn::Sequential;

torch::nn::Conv2d conv() { return torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 3, 1)); }

struct Layer1Impl : torch::nn::Module, Skippable {
  Layer1Impl() : Skippable({"1to3"}, {}) { conv_ = register_module("conv", conv()); }
  torch::Tensor forward(torch::Tensor input) {
    stash("1to3", input);
    return conv_(input);
  }
  torch::nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(Layer1);

struct Layer2Impl : torch::nn::Module {
  Layer2Impl() { conv_ = register_module("conv", conv()); }
  torch::Tensor forward(torch::Tensor input) { return conv_(input); }
  torch::nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(Layer2);

struct Layer3Impl : torch::nn::Module, Skippable {
  Layer3Impl() : Skippable({}, {"1to3"}) { conv_ = register_module("conv", conv()); }
  torch::Tensor forward(torch::Tensor input) { return conv_(input) + pop("1to3"); }
  torch::nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(Layer3);

using testing::expect_close;
using testing::Gradients;
using testing::gradients_of;

void check_1to3(const std::vector<int64_t>& balance, CheckpointMode mode,
                const std::vector<c10::Device>& devices) {
  torch::manual_seed(0);
  auto sequential = Sequential(Layer1(), Layer2(), Layer3());
  sequential->to(torch::kDouble);
  auto input = torch::rand({30, 3, 8, 8}, torch::kDouble);
  Gradients expected = gradients_of([&](const torch::Tensor& x) { return sequential->forward(x); },
                                    *sequential, input);

  GPipe model(sequential, GPipeOptions(balance).chunks(3).checkpoint(mode).devices(devices));
  Gradients actual = gradients_of(
      [&](const torch::Tensor& x) { return model->forward(x.to(model->devices()[0])).cpu(); },
      *model, input);
  expect_close(actual, expected);
}

TEST(SkipGPipeTest, OneToThree) {
  for (const auto& balance : std::vector<std::vector<int64_t>>{{3}, {1, 2}, {2, 1}, {1, 1, 1}}) {
    for (const auto mode :
         {CheckpointMode::kNever, CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
      SCOPED_TRACE(::testing::Message() << "balance size " << balance.size() << " first "
                                        << balance[0] << ", checkpoint " << mode);
      check_1to3(balance, mode, {});
    }
  }
}

// Backward after the GPipe is gone: the recomputations and the portals hold what they need.
TEST(SkipGPipeTest, DestroyedBeforeBackward) {
  for (const auto mode :
       {CheckpointMode::kNever, CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
    SCOPED_TRACE(::testing::Message() << "checkpoint " << mode);
    torch::manual_seed(0);
    auto sequential = Sequential(Layer1(), Layer2(), Layer3());
    sequential->to(torch::kDouble);
    auto input = torch::rand({30, 3, 8, 8}, torch::kDouble);
    Gradients expected = gradients_of(
        [&](const torch::Tensor& x) { return sequential->forward(x); }, *sequential, input);
    Gradients actual = gradients_of(
        [&](const torch::Tensor& x) {
          GPipe model(sequential, GPipeOptions({1, 1, 1}).chunks(3).checkpoint(mode));
          return model->forward(x);  // the GPipe is destroyed here, before backward
        },
        *sequential, input);
    expect_close(actual, expected);
  }
}

TEST(SkipGPipeTest, OneToThree_CUDA) {
  for (const auto& balance : std::vector<std::vector<int64_t>>{{3}, {1, 2}, {2, 1}, {1, 1, 1}}) {
    GPIPE_REQUIRE_CUDA(balance.size());
    std::vector<c10::Device> devices;
    for (size_t j = 0; j < balance.size(); ++j) {
      devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(j));
    }
    for (const auto mode :
         {CheckpointMode::kNever, CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
      check_1to3(balance, mode, devices);
    }
  }
}

TEST(SkipGPipeTest, OneToThreeAcrossCPUAndCUDA_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  for (const auto mode :
       {CheckpointMode::kNever, CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
    check_1to3({1, 1, 1}, mode, {torch::kCPU, torch::Device(torch::kCUDA, 0), torch::kCPU});
  }
}

// Every autograd node reachable from `root`, by name.
std::vector<std::string> node_names(const torch::Tensor& root) {
  std::vector<std::string> names;
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<std::shared_ptr<torch::autograd::Node>> stack{root.grad_fn()};
  while (!stack.empty()) {
    auto node = stack.back();
    stack.pop_back();
    if (!node || !seen.insert(node.get()).second) continue;
    names.push_back(node->name());
    for (const auto& edge : node->next_edges()) stack.push_back(edge.function);
  }
  return names;
}

bool has_portal(const std::vector<std::string>& names) {
  for (const auto& name : names) {
    if (name.find("Portal") != std::string::npos) return true;
  }
  return false;
}

struct StashNoneImpl : torch::nn::Module, Skippable {
  StashNoneImpl() : Skippable({"none"}, {}) {}
  torch::Tensor forward(torch::Tensor input) {
    stash("none", torch::Tensor());
    return input;
  }
};
TORCH_MODULE(StashNone);

struct PopNoneImpl : torch::nn::Module, Skippable {
  PopNoneImpl() : Skippable({}, {"none"}) {}
  torch::Tensor forward(torch::Tensor input) {
    TORCH_CHECK(!pop("none").defined(), "popped a defined tensor");
    return input;
  }
};
TORCH_MODULE(PopNone);

TEST(SkipGPipeTest, NoneSkip) {
  GPipe model(Sequential(StashNone(), PopNone()), GPipeOptions({1, 1}).chunks(5));
  auto input = torch::rand({10}, torch::requires_grad());
  auto output = model->forward(input);
  EXPECT_FALSE(has_portal(node_names(output)));
  output.sum().backward();
  EXPECT_EQ(input.grad().mean().item<float>(), 1.0F);
}

TEST(SkipGPipeTest, PortalsCarryTheSkipsBetweenPartitions) {
  GPipe model(Sequential(Layer1(), Layer2(), Layer3()),
              GPipeOptions({1, 2}).chunks(2).checkpoint(CheckpointMode::kNever));
  auto output = model->forward(torch::rand({4, 3, 2, 2}, torch::requires_grad()));
  const auto names = node_names(output);
  EXPECT_TRUE(has_portal(names));
  // Skips within one partition need no portal.
  GPipe single(Sequential(Layer1(), Layer2(), Layer3()), GPipeOptions({3}).chunks(2));
  EXPECT_FALSE(has_portal(node_names(single->forward(torch::rand({4, 3, 2, 2})))));
}

// Pops the skip and drops it: the stashed tensor gets no gradient from it.
struct PopAndDropImpl : torch::nn::Module, Skippable {
  PopAndDropImpl() : Skippable({}, {"1to3"}) {}
  torch::Tensor forward(torch::Tensor input) {
    pop("1to3");
    return input * 2;
  }
};
TORCH_MODULE(PopAndDrop);

TEST(SkipGPipeTest, PoppedTensorThatReachesNoLoss) {
  for (const auto mode :
       {CheckpointMode::kNever, CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
    auto sequential = Sequential(Layer1(), Layer2(), PopAndDrop());
    GPipe model(sequential, GPipeOptions({1, 1, 1}).chunks(2).checkpoint(mode));
    auto input = torch::rand({4, 3, 2, 2}, torch::requires_grad());
    model->forward(input).sum().backward();
    EXPECT_TRUE(input.grad().defined());
  }
}

// A skip carried by a list batch: the main lane is the first tensor.
struct StashSecondImpl : torch::nn::Module, Skippable {
  StashSecondImpl() : Skippable({"second"}, {}) {}
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> input) {
    stash("second", input[1]);
    return {input[0] * 2, input[1]};
  }
};
TORCH_MODULE(StashSecond);

struct AddPoppedImpl : torch::nn::Module, Skippable {
  AddPoppedImpl() : Skippable({}, {"second"}) {}
  torch::Tensor forward(std::vector<torch::Tensor> input) { return input[0] + pop("second"); }
};
TORCH_MODULE(AddPopped);

TEST(SkipGPipeTest, ListBatches) {
  auto a = torch::rand({6, 2}, torch::requires_grad());
  auto b = torch::rand({6, 2}, torch::requires_grad());
  GPipe model(Sequential(StashSecond(), AddPopped()), GPipeOptions({1, 1}).chunks(3));
  auto output = model->forward(std::vector<torch::Tensor>{a, b});
  EXPECT_TRUE(torch::allclose(output, a * 2 + b));
  output.sum().backward();
  EXPECT_TRUE(torch::allclose(a.grad(), torch::full_like(a, 2)));
  EXPECT_TRUE(torch::allclose(b.grad(), torch::ones_like(b)));
}

TEST(SkipGPipeTest, EvalAndNoGrad) {
  auto sequential = Sequential(Layer1(), Layer2(), Layer3());
  GPipe model(sequential, GPipeOptions({1, 1, 1}).chunks(3));
  auto input = torch::rand({6, 3, 2, 2});
  auto expected = sequential->forward(input);
  model->eval();
  EXPECT_TRUE(torch::allclose(model->forward(input), expected));
  torch::NoGradGuard no_grad;
  model->train();
  auto output = model->forward(input);
  EXPECT_FALSE(output.requires_grad());
  EXPECT_TRUE(torch::allclose(output, expected));
}

TEST(SkipGPipeTest, NamespacesKeepReusedLayersApart) {
  // Two nested pairs with the same name: outer (0 -> 3) and inner (1 -> 2).
  Namespace outer;
  Namespace inner;
  auto make = [&] {
    torch::manual_seed(1);
    return Sequential(isolate(Layer1(), outer), isolate(Layer1(), inner), isolate(Layer3(), inner),
                      isolate(Layer3(), outer));
  };
  Sequential sequential = make();
  sequential->to(torch::kDouble);
  auto input = torch::rand({8, 3, 2, 2}, torch::kDouble);
  Gradients expected = gradients_of([&](const torch::Tensor& x) { return sequential->forward(x); },
                                    *sequential, input);
  for (const auto& balance : std::vector<std::vector<int64_t>>{{1, 3}, {2, 2}, {1, 1, 1, 1}}) {
    Sequential copy = make();
    copy->to(torch::kDouble);
    GPipe model(copy, GPipeOptions(balance).chunks(4));
    expect_close(
        gradients_of([&](const torch::Tensor& x) { return model->forward(x); }, *model, input),
        expected);
  }
}

}  // namespace
}  // namespace skip_gpipe_test
}  // namespace skip
}  // namespace gpipe

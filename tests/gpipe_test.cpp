// Ports of torchgpipe's tests/test_gpipe.py, plus the checks the reference lacks.
#include "test_util.h"

#include <gpipe/gpipe.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <set>
#include <thread>

namespace gpipe {
namespace gpipe_test {
namespace {

using torch::nn::Linear;
using torch::nn::Sequential;

struct ExpectedException : std::runtime_error {
  ExpectedException() : std::runtime_error("expected") {}
};

torch::nn::Functional pass() {
  return torch::nn::Functional([](torch::Tensor x) { return x; });
}

torch::nn::Functional raise() {
  return torch::nn::Functional([](torch::Tensor x) -> torch::Tensor { throw ExpectedException(); });
}

// Counts the nodes reachable from `root` whose name contains `part`; a custom function's node is
// named "torch::autograd::CppNode<...::Checkpoint>".
int count_nodes(const std::shared_ptr<torch::autograd::Node>& root, const std::string& part) {
  std::set<torch::autograd::Node*> visited;
  std::function<int(const std::shared_ptr<torch::autograd::Node>&)> count =
      [&](const std::shared_ptr<torch::autograd::Node>& node) {
        if (!node || !visited.insert(node.get()).second) return 0;
        int found = node->name().find(part) != std::string::npos;
        for (const auto& edge : node->next_edges()) found += count(edge.function);
        return found;
      };
  return count(root);
}

TEST(GPipeTest, Parameters) {
  GPipe model(Sequential(Linear(1, 1)), GPipeOptions({1}).chunks(1));
  EXPECT_EQ(model->parameters().size(), 2u);
}

TEST(GPipeTest, PublicAttrs) {
  GPipe model(
      Sequential(Linear(1, 1)),
      GPipeOptions({1}).devices({torch::kCPU}).chunks(42).checkpoint(CheckpointMode::kAlways));
  EXPECT_EQ(model->balance(), std::vector<int64_t>{1});
  EXPECT_EQ(model->devices(), std::vector<c10::Device>{torch::kCPU});
  EXPECT_EQ(model->chunks(), 42);
  EXPECT_EQ(model->checkpoint(), CheckpointMode::kAlways);
}

TEST(GPipeTest, SequentialLike) {
  for (const auto& balance : {std::vector<int64_t>{2}, std::vector<int64_t>{1, 1}}) {
    Linear a(1, 1), b(1, 1);
    GPipe model(Sequential(a, b), GPipeOptions(balance));
    ASSERT_EQ(model->size(), 2u);
    EXPECT_EQ((*model)[0], a.ptr());
    EXPECT_EQ((*model)[1], b.ptr());
    EXPECT_EQ(model->ptr<torch::nn::LinearImpl>(1), b.ptr());
    std::vector<std::shared_ptr<torch::nn::Module>> layers(model->begin(), model->end());
    EXPECT_EQ(layers, (std::vector<std::shared_ptr<torch::nn::Module>>{a.ptr(), b.ptr()}));
    GPIPE_EXPECT_THROW_WITH((*model)[2], c10::IndexError, "index 2 is out of range (size: 2)");
  }
}

TEST(GPipeTest, BalanceWrongLength) {
  Sequential model(Linear(1, 1), Linear(1, 1));
  GPIPE_EXPECT_THROW_WITH(GPipe(model, GPipeOptions({1})), c10::ValueError,
                          "module and sum of balance have different length (module: 2, sum of "
                          "balance: 1)");
  GPIPE_EXPECT_THROW_WITH(GPipe(model, GPipeOptions({3})), c10::ValueError,
                          "(module: 2, sum of balance: 3)");
}

// Counts near the ends of int64_t: the sum is exact, never wrapped past the check.
TEST(GPipeTest, HugeCounts) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Sequential model(Linear(4, 4), Linear(4, 4));
  GPIPE_EXPECT_THROW_WITH(GPipe(model, GPipeOptions({kMax, kMax, 2})), c10::ValueError,
                          "(module: 2, sum of balance: 18446744073709551616)");
  GPIPE_EXPECT_THROW_WITH(GPipe(model, GPipeOptions({kMax, 1, 1 - kMax})), c10::ValueError,
                          "all balance numbers must be positive integer (balance: "
                          "[9223372036854775807, 1, -9223372036854775806])");
  // As torch.chunk: never more micro-batches than samples.
  const auto input = torch::rand({5, 4});
  GPipe huge(model, GPipeOptions({1, 1}).chunks(kMax));
  GPipe five(model, GPipeOptions({1, 1}).chunks(5));
  EXPECT_TRUE(testing::bitwise_equal(huge->forward(input), five->forward(input)));
}

TEST(GPipeTest, BalanceLessThan1) {
  Sequential model(Linear(1, 1), Linear(1, 1));
  GPIPE_EXPECT_THROW_WITH(GPipe(model, GPipeOptions({0, 2})), c10::ValueError,
                          "all balance numbers must be positive integer (balance: [0, 2])");
  GPIPE_EXPECT_THROW_WITH(GPipe(model, GPipeOptions({-1, 3})), c10::ValueError,
                          "(balance: [-1, 3])");
}

TEST(GPipeTest, ChunksLessThan1) {
  Sequential model(Linear(1, 1));
  GPIPE_EXPECT_THROW_WITH(GPipe(model, GPipeOptions({1}).chunks(0)), c10::ValueError,
                          "number of chunks must be positive integer (chunks: 0)");
  GPIPE_EXPECT_THROW_WITH(GPipe(model, GPipeOptions({1}).chunks(-1)), c10::ValueError,
                          "(chunks: -1)");
}

TEST(GPipeTest, TooFewDevices) {
  Sequential model(Linear(1, 1), Linear(1, 1), Linear(1, 1), Linear(1, 1));
  GPIPE_EXPECT_THROW_WITH(GPipe(model, GPipeOptions({1, 1, 1, 1}).devices({torch::kCPU})),
                          c10::IndexError,
                          "too few devices to hold given partitions (devices: 1, partitions: 4)");
}

TEST(GPipeTest, BatchSizeIndivisible) {
  GPipe model(Sequential(Linear(1, 1)), GPipeOptions({1}).chunks(4));
  EXPECT_EQ(model->forward(torch::rand({7, 1})).sizes(), (std::vector<int64_t>{7, 1}));
}

TEST(GPipeTest, BatchSizeSmall) {
  GPipe model(Sequential(Linear(1, 1)), GPipeOptions({1}).chunks(4));
  EXPECT_EQ(model->forward(torch::rand({2, 1})).sizes(), (std::vector<int64_t>{2, 1}));
}

TEST(GPipeTest, CheckpointMode) {
  Sequential sequential(Linear(1, 1));
  auto input = torch::rand({2, 1});
  auto output_of = [&](gpipe::CheckpointMode mode) {
    GPipe model(sequential, GPipeOptions({1}).chunks(2).checkpoint(mode));
    return model->forward(input);
  };
  EXPECT_EQ(count_nodes(output_of(CheckpointMode::kAlways).grad_fn(), "::Checkpoint>"), 2);
  EXPECT_EQ(count_nodes(output_of(CheckpointMode::kExceptLast).grad_fn(), "::Checkpoint>"), 1);
  EXPECT_EQ(count_nodes(output_of(CheckpointMode::kNever).grad_fn(), "::Checkpoint>"), 0);
}

TEST(GPipeTest, CheckpointModeInvalid) {
  GPIPE_EXPECT_THROW_WITH(parse_checkpoint_mode("INVALID_CHECKPOINT"), c10::ValueError,
                          "checkpoint is not one of 'always', 'except_last', or 'never' (got "
                          "'INVALID_CHECKPOINT')");
  GPIPE_EXPECT_THROW_WITH(
      GPipe(Sequential(Linear(1, 1)), GPipeOptions({1}).checkpoint(static_cast<CheckpointMode>(7))),
      c10::ValueError, "checkpoint is not one of 'always', 'except_last', or 'never' (got 7)");
  EXPECT_EQ(parse_checkpoint_mode("always"), CheckpointMode::kAlways);
  EXPECT_EQ(parse_checkpoint_mode("except_last"), CheckpointMode::kExceptLast);
  EXPECT_EQ(parse_checkpoint_mode("never"), CheckpointMode::kNever);
}

TEST(GPipeTest, CheckpointModeWhenChunks1) {
  Sequential sequential(Linear(1, 1));
  for (auto mode : {CheckpointMode::kExceptLast, CheckpointMode::kAlways, CheckpointMode::kNever}) {
    GPipe model(sequential, GPipeOptions({1}).chunks(1).checkpoint(mode));
    auto output = model->forward(torch::rand({2, 1}));
    const int expected = mode == CheckpointMode::kAlways ? 1 : 0;
    EXPECT_EQ(count_nodes(output.grad_fn(), "::Checkpoint>"), expected) << mode;
  }
}

// Unlike the reference, except_last counts the micro-batches there are, not the chunks asked for:
// batch 3 in chunks 4 makes 3 micro-batches, of which the last is not checkpointed.
TEST(GPipeTest, CheckpointExceptLastWithFewerMicroBatches) {
  GPipe model(Sequential(Linear(1, 1)), GPipeOptions({1}).chunks(4));
  auto output = model->forward(torch::rand({3, 1}));
  EXPECT_EQ(count_nodes(output.grad_fn(), "::Checkpoint>"), 2);
}

TEST(GPipeTest, CheckpointEval) {
  GPipe model(Sequential(Linear(1, 1)), GPipeOptions({1}).chunks(2));
  auto input = torch::rand({2, 1});
  model->train();
  auto train_output = model->forward(input);
  EXPECT_GT(count_nodes(train_output.grad_fn(), "::Checkpoint>"), 0);
  EXPECT_GT(count_nodes(train_output.grad_fn(), "::Recompute>"), 0);
  model->eval();
  auto eval_output = model->forward(input);
  EXPECT_EQ(count_nodes(eval_output.grad_fn(), "::Checkpoint>"), 0);
  EXPECT_EQ(count_nodes(eval_output.grad_fn(), "::Recompute>"), 0);
}

TEST(GPipeTest, NoGrad) {
  auto latent = std::make_shared<torch::Tensor>();
  Sequential sequential(Linear(1, 1), torch::nn::Functional([latent](torch::Tensor x) {
                          *latent = x;
                          return x;
                        }));
  GPipe model(sequential, GPipeOptions({2}).chunks(2));
  {
    torch::NoGradGuard no_grad;
    model->forward(torch::rand({2, 1}));
  }
  ASSERT_TRUE(latent->defined());
  EXPECT_EQ(latent->grad_fn(), nullptr);
  EXPECT_FALSE(latent->requires_grad());
}

TEST(GPipeTest, Exception) {
  GPipe model(Sequential(raise()), GPipeOptions({1}).chunks(1));
  EXPECT_THROW(model->forward(torch::rand({1})), ExpectedException);
}

// The partition before the failing one stops as soon as possible: later clocks never run.
TEST(GPipeTest, ExceptionEarlyStopAsap) {
  auto counter = std::make_shared<std::atomic<int>>(0);
  auto count = torch::nn::Functional([counter](torch::Tensor x) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ++*counter;
    return x;
  });
  GPipe model(Sequential(pass(), pass(), count, raise()), GPipeOptions({1, 1, 1, 1}).chunks(3));
  EXPECT_THROW(model->forward(torch::rand({3})), ExpectedException);
  EXPECT_EQ(counter->load(), 2);  // 3 if the clock after the failure had run
}

TEST(GPipeTest, ExceptionKeepsTypeAndMessage) {
  auto fail = torch::nn::Functional([](torch::Tensor x) -> torch::Tensor {
    TORCH_CHECK_VALUE(false, "bad value 42 in partition");
  });
  GPipe model(Sequential(pass(), fail), GPipeOptions({1, 1}).chunks(2));
  GPIPE_EXPECT_THROW_WITH(model->forward(torch::rand({2})), c10::ValueError,
                          "bad value 42 in partition");
}

// After any error the module works as before: nothing is left queued or half-done.
TEST(GPipeTest, UsableAfterError) {
  auto fail_next = std::make_shared<bool>(true);
  auto flaky = torch::nn::Functional([fail_next](torch::Tensor x) {
    if (*fail_next) throw ExpectedException();
    return x * 2;
  });
  GPipe model(Sequential(Linear(2, 2), flaky, Linear(2, 2)), GPipeOptions({1, 1, 1}).chunks(4));
  auto input = torch::rand({8, 2});
  EXPECT_THROW(model->forward(input), ExpectedException);
  GPIPE_EXPECT_THROW_WITH(model->forward(torch::tensor(1.0)), c10::ValueError, "0-dimensional");
  *fail_next = false;
  for (int repeat = 0; repeat < 3; ++repeat) {
    auto output = model->forward(input);
    output.sum().backward();
    EXPECT_EQ(output.sizes(), (std::vector<int64_t>{8, 2}));
  }
}

struct TwoImpl : torch::nn::Module {
  TwoImpl()
      : fc_a(register_module("fc_a", Linear(1, 1))), fc_b(register_module("fc_b", Linear(1, 1))) {}
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> a_and_b) {
    return {fc_a(a_and_b.at(0)), fc_b(a_and_b.at(1))};
  }
  Linear fc_a, fc_b;
};
TORCH_MODULE(Two);

TEST(GPipeTest, InputPair) {
  GPipe model(Sequential(Two()), GPipeOptions({1}).chunks(2));
  auto a = torch::rand({10, 1}, torch::requires_grad());
  auto b = torch::rand({10, 1}, torch::requires_grad());
  auto out = model->forward<std::vector<torch::Tensor>>(std::vector<torch::Tensor>{a, b});
  ASSERT_EQ(out.size(), 2u);
  (out[0] + out[1]).mean().backward();
  EXPECT_TRUE(a.grad().defined());
  EXPECT_TRUE(b.grad().defined());
}

struct OneImpl : torch::nn::Module {
  OneImpl() : fc(register_module("fc", Linear(1, 1))) {}
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> only_a) {
    return {fc(only_a.at(0))};
  }
  Linear fc;
};
TORCH_MODULE(One);

TEST(GPipeTest, InputSingleton) {
  GPipe model(Sequential(One()), GPipeOptions({1}).chunks(2));
  auto a = torch::rand({10, 1}, torch::requires_grad());
  auto out = model->forward<std::vector<torch::Tensor>>(std::vector<torch::Tensor>{a});
  ASSERT_EQ(out.size(), 1u);
  out[0].mean().backward();
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
  EXPECT_TRUE(a.grad().defined());
}

// The input list must not hide structure errors: different batch sizes are refused (the
// reference silently truncates to the shortest).
TEST(GPipeTest, InputPairDifferentBatchSizes) {
  GPipe model(Sequential(Two()), GPipeOptions({1}).chunks(2));
  GPIPE_EXPECT_THROW_WITH(model->forward<std::vector<torch::Tensor>>(std::vector<torch::Tensor>{
                              torch::rand({10, 1}), torch::rand({7, 1})}),
                          c10::ValueError, "tensor 0 has 10 and tensor 1 has 7");
}

TEST(GPipeTest, InputZeroDimensional) {
  GPipe model(Sequential(Linear(1, 1)), GPipeOptions({1}).chunks(2));
  GPIPE_EXPECT_THROW_WITH(model->forward(torch::tensor(3.0)), c10::ValueError,
                          "input tensor 0 is 0-dimensional (shape [])");
}

TEST(GPipeTest, InputUndefined) {
  GPipe model(Sequential(Linear(1, 1)), GPipeOptions({1}));
  GPIPE_EXPECT_THROW_WITH(model->forward(torch::Tensor()), c10::ValueError,
                          "input tensor 0 is undefined");
  GPIPE_EXPECT_THROW_WITH(model->forward(std::vector<torch::Tensor>{}), c10::ValueError,
                          "expected at least one tensor in the input");
}

TEST(GPipeTest, InputOnWrongDevice_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  GPipe model(Sequential(Linear(1, 1)), GPipeOptions({1}).devices({torch::Device("cuda:0")}));
  GPIPE_EXPECT_THROW_WITH(model->forward(torch::rand({2, 1})), c10::ValueError,
                          "input tensor 0 is on cpu, but the first partition is on cuda:0");
}

struct NonTensorImpl : torch::nn::Module {
  std::string forward(torch::Tensor) { return "hello"; }
};
TORCH_MODULE(NonTensor);

struct NonTensorTupleImpl : torch::nn::Module {
  std::tuple<torch::Tensor, std::string> forward(torch::Tensor x) { return {x, "hello"}; }
};
TORCH_MODULE(NonTensorTuple);

struct NestedListImpl : torch::nn::Module {
  std::vector<std::vector<torch::Tensor>> forward(torch::Tensor x) { return {{x}, {x}}; }
};
TORCH_MODULE(NestedList);

// In C++ a non-tensor input does not compile; a non-tensor output between partitions is a
// TypeError that names the type and the partition.
TEST(GPipeTest, NonTensor) {
  GPipe model(Sequential(NonTensor()), GPipeOptions({1}));
  GPIPE_EXPECT_THROW_WITH(model->forward(torch::rand({1})), c10::TypeError,
                          "expected Tensor or std::vector<Tensor>, but got std::");
  GPIPE_EXPECT_THROW_WITH(model->forward(torch::rand({1})), c10::TypeError, "from partition 0");
}

TEST(GPipeTest, NonTensorTuple) {
  GPipe model(Sequential(pass(), NonTensorTuple()), GPipeOptions({1, 1}));
  GPIPE_EXPECT_THROW_WITH(model->forward(torch::rand({1})), c10::TypeError, "from partition 1");
}

TEST(GPipeTest, NestedListOutput) {
  GPipe model(Sequential(NestedList(), pass()), GPipeOptions({1, 1}).chunks(2));
  GPIPE_EXPECT_THROW_WITH(model->forward(torch::rand({2, 1})), c10::TypeError, "from partition 0");
}

TEST(GPipeTest, ReturnTypeMismatch) {
  GPipe model(Sequential(Two()), GPipeOptions({1}));
  std::vector<torch::Tensor> pair{torch::rand({2, 1}), torch::rand({2, 1})};
  GPIPE_EXPECT_THROW_WITH(model->forward(pair), c10::TypeError,
                          "the pipeline returned a list of 2 tensors, but a Tensor was asked for");
  GPipe single(Sequential(Linear(1, 1)), GPipeOptions({1}));
  GPIPE_EXPECT_THROW_WITH(single->forward<std::vector<torch::Tensor>>(torch::rand({2, 1})),
                          c10::TypeError, "the pipeline returned a Tensor, but a std::vector");
}

TEST(GPipeTest, Devices) {
  GPipe model(Sequential(Linear(1, 1), Linear(1, 1), Linear(1, 1)),
              GPipeOptions({1, 2}).devices({torch::kCPU, torch::kCPU, torch::kCPU}));
  // Extra devices are dropped.
  EXPECT_EQ(model->devices(), (std::vector<c10::Device>{torch::kCPU, torch::kCPU}));
}

TEST(GPipeTest, Partitions) {
  GPipe model(Sequential(Linear(1, 1), Linear(1, 1)), GPipeOptions({1, 1}));
  ASSERT_EQ(model->partitions().size(), 2u);
  EXPECT_EQ(model->partitions()[0]->size(), 1u);
  const auto names = model->named_parameters().keys();
  EXPECT_THAT(names, ::testing::Contains("partitions.0.0.weight"));
  EXPECT_THAT(names, ::testing::Contains("partitions.1.1.weight"));
}

TEST(GPipeTest, DenyMoving) {
  GPipe model(Sequential(Linear(1, 1)), GPipeOptions({1}));
  const std::string denied =
      "denied to move parameters and buffers, because GPipe should manage device placement";
  GPIPE_EXPECT_THROW_WITH(model->to(torch::kCPU), c10::TypeError, denied);
  GPIPE_EXPECT_THROW_WITH(model->to(torch::kCPU, torch::kDouble), c10::TypeError, denied);
  // Casting dtype is allowed, and the pipeline then runs in it.
  model->to(torch::kDouble);
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kDouble);
  EXPECT_EQ(model->forward(torch::rand({2, 1}, torch::kDouble)).scalar_type(), torch::kDouble);
}

TEST(GPipeTest, EmptyModule) {
  // An empty Sequential is legal: the identity.
  GPipe model(Sequential(), GPipeOptions(std::vector<int64_t>{}));
  EXPECT_TRUE(testing::bitwise_equal(model->forward(torch::tensor(42)), torch::tensor(42)));
  auto out =
      model->forward<std::vector<torch::Tensor>>(std::vector<torch::Tensor>{torch::tensor(42)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(testing::bitwise_equal(out[0], torch::tensor(42)));
}

TEST(GPipeTest, NamedChildren) {
  Sequential sequential;
  sequential->push_back("a", Linear(1, 1));
  sequential->push_back("b", Linear(1, 1));
  GPipe model(sequential, GPipeOptions({1, 1}));
  const auto names = model->named_modules().keys();
  EXPECT_THAT(names, ::testing::Contains("partitions.0.a"));
  EXPECT_THAT(names, ::testing::Contains("partitions.1.b"));
}

TEST(GPipeTest, RecommendAutoBalance) {
  GPIPE_EXPECT_THROW_WITH(GPipe(Sequential(), GPipeOptions({1})), c10::ValueError,
                          "gpipe::balance");
  GPIPE_EXPECT_THROW_WITH(GPipe(Sequential(Linear(1, 1), Linear(1, 1)), GPipeOptions({1})),
                          c10::ValueError, "gpipe::balance");
}

TEST(GPipeTest, VerifyModuleDuplicateChildren) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 3, 1));
  GPIPE_EXPECT_THROW_WITH(GPipe(Sequential(conv, conv), GPipeOptions({1, 1})), c10::ValueError,
                          "module with duplicate children is not supported (children 0 and 1 are "
                          "the same module)");
}

struct SurrogateImpl : torch::nn::Module {
  explicit SurrogateImpl(torch::nn::Conv2d conv) { register_module("module", std::move(conv)); }
  torch::Tensor forward(torch::Tensor x) { return x; }
};
TORCH_MODULE(Surrogate);

TEST(GPipeTest, VerifyModuleDuplicateParametersInDistinctChildren) {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 3, 1));
  GPIPE_EXPECT_THROW_WITH(
      GPipe(Sequential(Surrogate(conv), Surrogate(conv)), GPipeOptions({1, 1})), c10::ValueError,
      "module with duplicate parameters in distinct children is not supported (parameter "
      "'module.weight' of child 1 is also in child 0)");
}

// Workers persist across calls and one forward runs at a time: concurrent callers are
// serialized and each gets its own result.
TEST(GPipeTest, ConcurrentForwardsAreSerialized) {
  torch::manual_seed(0);
  GPipe model(Sequential(Linear(4, 4), torch::nn::ReLU(), Linear(4, 4)),
              GPipeOptions({2, 1}).chunks(4));
  std::vector<torch::Tensor> inputs, expected, got(4);
  for (int k = 0; k < 4; ++k) {
    inputs.push_back(torch::rand({8, 4}));
    torch::NoGradGuard no_grad;
    expected.push_back(model->forward(inputs.back()));
  }
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      torch::NoGradGuard no_grad;
      for (int repeat = 0; repeat < 10; ++repeat) got[k] = model->forward(inputs[k]);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(testing::bitwise_equal(got[k], expected[k])) << k;
}

// A Sequential keeps its layers alive through the autograd graph; so does a GPipe, whose
// recomputations run in backward, possibly after the GPipe itself is gone.
TEST(GPipeTest, DestroyedBeforeBackward) {
  for (const auto mode :
       {CheckpointMode::kNever, CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
    SCOPED_TRACE(::testing::Message() << "checkpoint " << mode);
    torch::manual_seed(0);
    Sequential sequential(Linear(4, 8), torch::nn::ReLU(), torch::nn::Dropout(0.5), Linear(8, 2));
    sequential->to(torch::kDouble);
    const auto input = torch::rand({6, 4}, torch::kDouble).requires_grad_(true);
    auto run = [&](bool keep) {
      torch::manual_seed(1);  // the same dropout masks
      auto model =
          std::make_unique<GPipe>(sequential, GPipeOptions({2, 2}).chunks(3).checkpoint(mode));
      const auto output = (*model)->forward(input);
      if (!keep) model.reset();
      output.sum().backward();
      std::vector<torch::Tensor> grads{input.grad().clone()};
      input.mutable_grad().reset();
      for (auto& p : sequential->parameters()) {
        grads.push_back(p.grad().clone());
        p.mutable_grad().reset();
      }
      return grads;
    };
    const auto kept = run(true);
    const auto destroyed = run(false);
    ASSERT_EQ(kept.size(), destroyed.size());
    for (size_t k = 0; k < kept.size(); ++k) {
      EXPECT_TRUE(testing::bitwise_equal(kept[k], destroyed[k])) << "gradient " << k;
    }
  }
}

TEST(GPipeTest, PrettyPrint) {
  GPipe model(Sequential(Linear(1, 1), Linear(1, 1)), GPipeOptions({1, 1}).chunks(3));
  std::ostringstream out;
  model->pretty_print(out);
  EXPECT_EQ(out.str(), "gpipe::GPipe(balance=[1, 1], chunks=3, checkpoint=except_last)");
}

}  // namespace
}  // namespace gpipe_test
}  // namespace gpipe

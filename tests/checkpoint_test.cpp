// Ports torchgpipe's tests/test_checkpoint.py, plus the checkpoint's RNG, flag and gradient
// guarantees.
#include "test_util.h"

#include "detail/checkpointing.h"
#include "detail/dependency.h"
#include "gpipe/checkpoint.h"

#include <torch/torch.h>

#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpipe {
namespace checkpoint_test {
namespace {

using detail::Checkpointing;
using detail::fork;
using detail::join;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const std::vector<c10::Device> kDevices = [] {
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  if (torch::cuda::is_available()) devices.emplace_back(c10::kCUDA, 0);
  return devices;
}();

// Records "<name>:forward" and "<name>:backward" in `timeline`.
struct Log : torch::autograd::Function<Log> {
  static torch::Tensor forward(AutogradContext* ctx, std::vector<std::string>* timeline,
                               std::string name, const torch::Tensor& x) {
    ctx->saved_data["timeline"] = reinterpret_cast<int64_t>(timeline);
    ctx->saved_data["name"] = name;
    timeline->push_back(name + ":forward");
    return x.detach();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    auto* timeline =
        reinterpret_cast<std::vector<std::string>*>(ctx->saved_data["timeline"].toInt());
    timeline->push_back(ctx->saved_data["name"].toStringRef() + ":backward");
    return {torch::Tensor(), torch::Tensor(), grad_output[0]};
  }
};

BatchFunction log_function(std::vector<std::string>* timeline, std::string name) {
  return
      [timeline, name](const Batch& input) { return Batch(Log::apply(timeline, name, input[0])); };
}

TEST(CheckpointTest, SerialCheckpoints) {
  for (const auto& device : kDevices) {
    SCOPED_TRACE(device.str());
    std::vector<std::string> timeline;

    torch::Tensor a = torch::rand({1}, torch::device(device).requires_grad(true));
    torch::Tensor b = torch::rand({1}, torch::device(device).requires_grad(true));

    // Increase the next function sequence number.
    torch::Tensor unused = a + 1 + 2 + 3 + 4 + 5;

    a = checkpoint(log_function(&timeline, "a"), Batch(a)).tensor();

    torch::Tensor phony;
    std::tie(a, phony) = fork(a);
    b = join(b, phony);

    b = checkpoint(log_function(&timeline, "b"), Batch(b)).tensor();

    torch::Tensor c = torch::cat({a, b});
    torch::Tensor out = c.sum();

    //                        +--> {a} --Checkpoint(Log)--> {a}
    // {out} --Sum--> {c} --Cat     ^-----------------------------+
    //                        +--> {b} --Checkpoint(Log)--> {b} --First--> {b}
    out.backward();

    EXPECT_EQ(timeline, (std::vector<std::string>{"a:forward", "b:forward", "b:forward",
                                                  "b:backward", "a:forward", "a:backward"}));
    //                                             |  forward pass  | Checkpoint(b) | Checkpoint(a)
  }
}

TEST(CheckpointTest, NotRequiresGrad) {
  Batch x(torch::rand({1}));
  ASSERT_FALSE(x[0].requires_grad());

  auto f = [](const Batch& input) { return Batch(input[0] * 2); };

  Checkpointing chk(f, x);
  Batch y = chk.checkpoint();
  // The phony that requires grad keeps the Checkpoint node in the graph.
  EXPECT_TRUE(y[0].requires_grad());
  EXPECT_TRUE(torch::equal(y[0], x[0] * 2));

  chk.recompute(y);
  EXPECT_TRUE(y[0].requires_grad());

  EXPECT_NO_THROW(y.tensor().backward());
}

TEST(CheckpointTest, NotRequiresGradWithParameter) {
  torch::Tensor x = torch::rand({1});
  torch::Tensor a = torch::rand({1}, torch::requires_grad());

  auto f = [a](const Batch& input) { return Batch(input[0] * a); };

  Batch y = checkpoint(f, Batch(x));
  ASSERT_TRUE(y.tensor().requires_grad());
  y.tensor().backward();

  ASSERT_TRUE(a.grad().defined());
  EXPECT_TRUE(torch::allclose(a.grad(), x));
}

TEST(CheckpointTest, RandomInCheckpoint) {
  for (const auto& device : kDevices) {
    SCOPED_TRACE(device.str());
    torch::nn::Dropout dropout(torch::nn::DropoutOptions(0.5));
    auto function = [&dropout](const Batch& input) { return Batch(dropout(input[0])); };

    torch::manual_seed(0);
    torch::Tensor x = torch::randn({3, 3}, torch::device(device).requires_grad(true));
    torch::Tensor y = dropout(x);
    y.norm().backward();

    torch::manual_seed(0);
    torch::Tensor chk_x = torch::randn({3, 3}, torch::device(device).requires_grad(true));
    torch::Tensor chk_y = checkpoint(function, Batch(chk_x)).tensor();
    chk_y.norm().backward();

    EXPECT_TRUE(torch::equal(y, chk_y));
    EXPECT_TRUE(torch::allclose(x.grad(), chk_x.grad()));
  }
}

TEST(CheckpointTest, RecomputeDrawsTheForwardMasks) {
  // The dropout masks drawn in the recomputation equal those of the checkpointed forward, even
  // when the generator has moved on in between.
  torch::manual_seed(1);
  torch::Tensor x = torch::ones({64}, torch::requires_grad());
  std::vector<torch::Tensor> masks;  // the masks each run of the function drew
  auto function = [&masks](const Batch& input) {
    torch::Tensor mask = torch::bernoulli(torch::full_like(input[0], 0.5));
    masks.push_back(mask.detach().clone());
    return Batch(input[0] * mask);
  };

  Batch y = checkpoint(function, Batch(x));
  torch::rand({1000});  // moves the generator on
  y.tensor().sum().backward();

  ASSERT_EQ(masks.size(), 2u);
  EXPECT_TRUE(torch::equal(masks[0], masks[1]));
  // Not trivially equal: some of the 64 are dropped and some kept.
  EXPECT_GT(masks[0].sum().item<float>(), 0.0f);
  EXPECT_LT(masks[0].sum().item<float>(), 64.0f);
  // The gradient is the forward's mask.
  EXPECT_TRUE(torch::equal(x.grad(), masks[0]));
  EXPECT_TRUE(torch::equal(y.tensor(), masks[0]));
}

TEST(CheckpointTest, RecomputeRestoresOuterRngState) {
  // Restoring the forward's RNG state for the recomputation must not leak out of backward: the
  // generator continues from where it was before backward.
  torch::Tensor x = torch::ones({16}, torch::requires_grad());
  auto function = [](const Batch& input) {
    return Batch(input[0] * torch::bernoulli(torch::full_like(input[0], 0.5)));
  };

  torch::manual_seed(2);
  Batch y = checkpoint(function, Batch(x));
  torch::Tensor first = torch::rand({8});
  torch::Tensor second = torch::rand({8});  // what the generator draws without any backward

  torch::manual_seed(2);
  Batch y2 = checkpoint(function, Batch(x));
  torch::Tensor first_again = torch::rand({8});
  y2.tensor().sum().backward();
  torch::Tensor after_backward = torch::rand({8});

  EXPECT_TRUE(torch::equal(first, first_again));
  EXPECT_TRUE(torch::equal(second, after_backward));
}

// Appends (is_checkpointing(), is_recomputing()) to `logs`.
struct DetectImpl : torch::nn::Module {
  explicit DetectImpl(std::vector<std::pair<bool, bool>>* logs) : logs(logs) {}
  torch::Tensor forward(torch::Tensor input) {
    logs->emplace_back(is_checkpointing(), is_recomputing());
    return input;
  }
  std::vector<std::pair<bool, bool>>* logs;
};
TORCH_MODULE(Detect);

TEST(CheckpointTest, DetectCheckpointingRecomputing) {
  std::vector<std::pair<bool, bool>> logs;
  Detect model(&logs);
  torch::Tensor input = torch::rand({1}, torch::requires_grad());

  Batch output = checkpoint([&model](const Batch& x) { return Batch(model(x[0])); }, Batch(input));
  output.tensor().backward();

  EXPECT_EQ(logs, (std::vector<std::pair<bool, bool>>{{true, false}, {false, true}}));
  // Reset afterwards.
  EXPECT_FALSE(is_checkpointing());
  EXPECT_FALSE(is_recomputing());
  // The identity's gradient.
  EXPECT_TRUE(torch::equal(input.grad(), torch::ones({1})));
}

TEST(CheckpointTest, DetectCheckpointingRecomputingWithoutCheckpoint) {
  std::vector<std::pair<bool, bool>> logs;
  Detect model(&logs);
  torch::Tensor input = torch::rand({1}, torch::requires_grad());

  torch::Tensor output = model(input);
  output.backward();

  EXPECT_EQ(logs, (std::vector<std::pair<bool, bool>>{{false, false}}));
}

TEST(CheckpointTest, FlagsAreThreadLocal) {
  std::vector<bool> other_thread;
  auto function = [&other_thread](const Batch& input) {
    EXPECT_TRUE(is_checkpointing());
    std::thread thread([&other_thread] {
      other_thread.push_back(is_checkpointing());
      other_thread.push_back(is_recomputing());
    });
    thread.join();
    return Batch(input[0] + 1);
  };
  Batch y = checkpoint(function, Batch(torch::rand({1}, torch::requires_grad())));
  EXPECT_EQ(other_thread, (std::vector<bool>{false, false}));
}

TEST(CheckpointTest, GradModeInForwardAndRecompute) {
  std::vector<bool> grad_enabled;
  auto function = [&grad_enabled](const Batch& input) {
    grad_enabled.push_back(torch::autograd::GradMode::is_enabled());
    return Batch(input[0] * 3);
  };
  torch::Tensor x = torch::rand({2}, torch::requires_grad());
  Batch y = checkpoint(function, Batch(x));
  y.tensor().sum().backward();
  // Forward keeps no graph; the recomputation builds one.
  EXPECT_EQ(grad_enabled, (std::vector<bool>{false, true}));
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({2}, 3.0f)));
}

TEST(CheckpointTest, OutputRequiresGradWhenNoInputDoes) {
  torch::Tensor x = torch::rand({3});
  Batch y = checkpoint([](const Batch& input) { return Batch(input[0].relu()); }, Batch(x));
  EXPECT_TRUE(y.tensor().requires_grad());
  EXPECT_TRUE(torch::equal(y.tensor(), x.relu()));
  EXPECT_NO_THROW(y.tensor().sum().backward());
}

TEST(CheckpointTest, NonFloatingOutputsDetached) {
  torch::Tensor x = torch::rand({4}, torch::requires_grad());
  auto function = [](const Batch& input) {
    torch::Tensor y = input[0] * 2;
    return Batch(std::vector<torch::Tensor>{y, y.argsort(), y > 1});
  };

  Batch out = checkpoint(function, Batch(x));
  ASSERT_FALSE(out.atomic());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_FALSE(out[1].grad_fn());
  EXPECT_EQ(out[1].scalar_type(), torch::kLong);
  EXPECT_FALSE(out[2].requires_grad());
  EXPECT_EQ(out[2].scalar_type(), torch::kBool);
  EXPECT_TRUE(torch::equal(out[1], (x * 2).argsort()));

  out[0].sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({4}, 2.0f)));
}

TEST(CheckpointTest, ListBatches) {
  torch::Tensor x = torch::rand({2, 3}, torch::requires_grad());
  torch::Tensor mask = torch::tensor({{1.0f, 0.0f, 1.0f}, {0.0f, 1.0f, 1.0f}});
  torch::Tensor index = torch::tensor({2, 0});
  auto function = [](const Batch& input) {
    // A list in, with a non-floating tensor; a list out, one of which is unused in the loss.
    torch::Tensor masked = input[0] * input[1];
    return Batch(std::vector<torch::Tensor>{masked.index_select(1, input[2]), masked.exp()});
  };

  Batch out = checkpoint(function, Batch(std::vector<torch::Tensor>{x, mask, index}));
  ASSERT_FALSE(out.atomic());
  ASSERT_EQ(out.size(), 2u);
  out[0].sum().backward();

  torch::Tensor expected_grad = torch::zeros({2, 3});
  expected_grad.index_fill_(1, torch::tensor({2}), 1.0f);
  expected_grad.index_fill_(1, torch::tensor({0}), 1.0f);
  EXPECT_TRUE(torch::equal(x.grad(), expected_grad * mask));
}

TEST(CheckpointTest, LossOnLaterOutputOnly) {
  // The recomputation hangs on the first output that requires grad; a loss that uses only a later
  // output must still recompute before Checkpoint's backward.
  torch::Tensor x = torch::rand({3}, torch::requires_grad());
  auto function = [](const Batch& input) {
    return Batch(std::vector<torch::Tensor>{input[0] * 2, input[0] * 3});
  };
  Batch out = checkpoint(function, Batch(x));
  ASSERT_EQ(out.size(), 2u);
  out[1].sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({3}, 3.0f)));
}

TEST(CheckpointTest, AtomicityPreserved) {
  torch::Tensor x = torch::rand({2});
  Batch listed = checkpoint(
      [](const Batch& input) { return Batch(std::vector<torch::Tensor>{input[0] + 1}); }, Batch(x));
  EXPECT_FALSE(listed.atomic());
  Batch atomic = checkpoint(
      [](const Batch& input) {
        EXPECT_FALSE(input.atomic());
        return Batch(input[0] + input[1]);
      },
      Batch(std::vector<torch::Tensor>{x, x}));
  EXPECT_TRUE(atomic.atomic());
  EXPECT_TRUE(torch::allclose(atomic.tensor(), x * 2));
}

// The backbone: a checkpointed model has the very output and gradients of the plain one.
TEST(CheckpointTest, GradientsEqualUncheckpointed) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Dropout(0.3),
                              torch::nn::Linear(8, 2));
  torch::Tensor input = torch::randn({5, 4});

  auto run = [&](bool checkpointed) {
    model->zero_grad();
    torch::Tensor x = input.clone().requires_grad_(true);
    torch::manual_seed(4);
    torch::Tensor y =
        checkpointed
            ? checkpoint([&model](const Batch& b) { return Batch(model->forward(b[0])); }, Batch(x))
                  .tensor()
            : model->forward(x);
    (y * y).sum().backward();
    std::vector<torch::Tensor> grads{y.detach(), x.grad()};
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };

  std::vector<torch::Tensor> plain = run(false);
  std::vector<torch::Tensor> checkpointed = run(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  ASSERT_EQ(plain.size(), 2u + 4u);
  for (size_t k = 0; k < plain.size(); ++k) {
    EXPECT_TRUE(torch::allclose(plain[k], checkpointed[k], 1e-6, 1e-6)) << "tensor " << k;
  }
}

TEST(CheckpointTest, CheckpointAndRecomputeOnDifferentThreads) {
  // As in the pipeline: checkpoint() on a worker thread, recompute() on the driving thread.
  torch::Tensor w = torch::rand({3}, torch::requires_grad());
  torch::Tensor x = torch::rand({3}, torch::requires_grad());
  auto function = [w](const Batch& input) { return Batch((input[0] * w).sin()); };

  Checkpointing chk(function, Batch(x));
  c10::optional<Batch> output;
  std::thread worker([&] { output = chk.checkpoint(); });
  worker.join();
  ASSERT_TRUE(output.has_value());
  chk.recompute(*output);
  output->tensor().sum().backward();

  EXPECT_TRUE(torch::allclose(x.grad(), (x * w).cos() * w));
  EXPECT_TRUE(torch::allclose(w.grad(), (x * w).cos() * x));
}

TEST(CheckpointTest, RecomputeRunsRightBeforeBackward) {
  // Two checkpoints in a chain: each is recomputed just before its own backward, in reverse.
  std::vector<std::string> timeline;
  torch::Tensor x = torch::rand({1}, torch::requires_grad());
  torch::Tensor h = checkpoint(log_function(&timeline, "first"), Batch(x)).tensor();
  torch::Tensor y = checkpoint(log_function(&timeline, "second"), Batch(h * 2)).tensor();
  y.backward();
  EXPECT_EQ(timeline,
            (std::vector<std::string>{"first:forward", "second:forward", "second:forward",
                                      "second:backward", "first:forward", "first:backward"}));
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({1}, 2.0f)));
}

}  // namespace
}  // namespace checkpoint_test
}  // namespace gpipe

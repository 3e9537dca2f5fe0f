// Ports torchgpipe's tests/test_dependency.py, plus checks of the backward order fork/join forces.
#include "test_util.h"

#include "detail/dependency.h"

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gpipe {
namespace dependency_test {
namespace {

using detail::fork;
using detail::join;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Records `number` in `log` when its backward runs.
struct Log : torch::autograd::Function<Log> {
  static torch::Tensor forward(AutogradContext* ctx, std::vector<int>* log, int64_t number,
                               const torch::Tensor& tensor) {
    ctx->saved_data["log"] = reinterpret_cast<int64_t>(log);
    ctx->saved_data["number"] = number;
    return tensor.detach();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    auto* log = reinterpret_cast<std::vector<int>*>(ctx->saved_data["log"].toInt());
    log->push_back(static_cast<int>(ctx->saved_data["number"].toInt()));
    return {torch::Tensor(), torch::Tensor(), grad[0]};
  }
};

std::string node_name(const torch::Tensor& x) { return x.grad_fn() ? x.grad_fn()->name() : ""; }

// Runs `make` on a fresh thread. Autograd sequence numbers are thread-local, so nodes made there
// number from zero: the CPU engine, which runs ready nodes of higher sequence numbers first, would
// run them last unless an edge says otherwise. This is the situation of the pipeline's workers.
template <typename F>
void on_fresh_thread(F make) {
  std::thread thread(make);
  thread.join();
}

// Lane a: leaf -> Log(1) -> fork, made with high sequence numbers on this thread.
// Lane b: leaf -> [join] -> Log(2), made on a fresh thread with low sequence numbers.
// Returns the backward order of the two Logs.
std::vector<int> lanes_backward_order(bool with_join) {
  std::vector<int> log;
  torch::Tensor a = torch::rand({1}, torch::requires_grad());
  torch::Tensor b = torch::rand({1}, torch::requires_grad());

  // Raise this thread's sequence numbers far above the fresh thread's.
  torch::Tensor bump = torch::rand({1}, torch::requires_grad());
  for (int k = 0; k < 100; ++k) bump = bump + 1;

  a = Log::apply(&log, 1, a);
  auto [a2, phony] = fork(a);
  on_fresh_thread([&, phony = phony] {
    if (with_join) b = join(b, phony);
    b = Log::apply(&log, 2, b);
  });
  (a2 + b).backward();
  return log;
}

TEST(DependencyTest, ForkJoin) {
  // The CPU version of torchgpipe's CUDA-only test_fork_join, made to depend on the join: without
  // it, the engine would run Log(1) first (see the control below).
  EXPECT_EQ(lanes_backward_order(/*with_join=*/true), (std::vector<int>{2, 1}));
}

TEST(DependencyTest, ForkJoinControlWithoutJoin) {
  // Shows that ForkJoin can fail: with no join, the higher sequence number of Log(1) wins.
  EXPECT_EQ(lanes_backward_order(/*with_join=*/false), (std::vector<int>{1, 2}));
}

TEST(DependencyTest, ForkJoin_CUDA) {
  GPIPE_REQUIRE_CUDA(1);
  std::vector<int> log;
  torch::Tensor a = torch::rand({1}, torch::requires_grad());
  torch::Tensor b = torch::rand({1}, torch::device(torch::kCUDA).requires_grad(true));

  a = Log::apply(&log, 1, a);
  auto [a2, phony] = fork(a);
  b = join(b, phony);
  b = Log::apply(&log, 2, b);
  b = b.to(torch::kCPU);

  (a2 + b).backward();

  EXPECT_EQ(log, (std::vector<int>{2, 1}));
}

TEST(DependencyTest, ForkJoinEnableGrad) {
  torch::Tensor x = torch::rand({1}, torch::requires_grad());

  torch::Tensor x2, p;
  {
    torch::AutoGradMode enable_grad(true);
    std::tie(x2, p) = fork(x);
  }

  EXPECT_TRUE(p.requires_grad());
  EXPECT_FALSE(x2.is_same(x));
  x = x2;

  EXPECT_TRUE(x.requires_grad());
  EXPECT_TRUE(p.requires_grad());
  EXPECT_THAT(node_name(x), ::testing::HasSubstr("Fork"));
  EXPECT_THAT(node_name(p), ::testing::HasSubstr("Fork"));
  EXPECT_EQ(x.grad_fn(), p.grad_fn());
  EXPECT_EQ(p.numel(), 0);

  {
    torch::AutoGradMode enable_grad(true);
    x2 = join(x, p);
  }

  EXPECT_FALSE(x2.is_same(x));
  x = x2;

  EXPECT_TRUE(x.requires_grad());
  EXPECT_THAT(node_name(x), ::testing::HasSubstr("Join"));
}

TEST(DependencyTest, ForkJoinNoGrad) {
  // torchgpipe monkeypatches Function.apply to fail; here: the very same tensors come back and
  // no node is recorded.
  torch::Tensor x = torch::rand({1}, torch::requires_grad());

  torch::Tensor x2, p;
  {
    torch::NoGradGuard no_grad;
    std::tie(x2, p) = fork(x);
  }

  EXPECT_FALSE(p.requires_grad());
  EXPECT_FALSE(p.grad_fn());
  EXPECT_TRUE(x2.is_same(x));
  x = x2;

  {
    torch::NoGradGuard no_grad;
    x2 = join(x, p);
  }

  EXPECT_TRUE(x2.is_same(x));
  EXPECT_FALSE(x2.grad_fn());
}

TEST(DependencyTest, JoinNoGradWithPhonyRequiringGrad) {
  torch::Tensor x = torch::rand({1});
  torch::Tensor p = torch::empty({0}, torch::requires_grad());
  torch::NoGradGuard no_grad;
  torch::Tensor y = join(x, p);
  EXPECT_TRUE(y.is_same(x));
  EXPECT_FALSE(y.requires_grad());
}

// Identity that stores a weak reference to its own node when its backward runs.
struct Remember : torch::autograd::Function<Remember> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input) {
    return input.detach();
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return grad; }
};

TEST(DependencyTest, ForkLeak) {
  // torchgpipe checks that Fork's context does not leak through a reference cycle; here, every
  // node of the graph is freed once the tensors are gone.
  std::weak_ptr<torch::autograd::Node> remember_node, fork_node, join_node;
  {
    torch::Tensor x = torch::rand({1}, torch::requires_grad());
    x = Remember::apply(x);
    remember_node = x.grad_fn();
    auto [forked, phony] = fork(x);
    fork_node = forked.grad_fn();
    x = join(forked, phony);
    join_node = x.grad_fn();

    x.backward();
    ASSERT_FALSE(remember_node.expired());
    ASSERT_FALSE(fork_node.expired());
  }
  EXPECT_TRUE(remember_node.expired());
  EXPECT_TRUE(fork_node.expired());
  EXPECT_TRUE(join_node.expired());
}

TEST(DependencyTest, JoinWhenForkNotRequiresGrad) {
  torch::Tensor x = torch::rand({2, 1});
  auto chunks = x.chunk(2);
  torch::Tensor a = chunks[0], b = chunks[1];

  EXPECT_FALSE(a.requires_grad());
  torch::Tensor p;
  std::tie(a, p) = fork(a);
  EXPECT_FALSE(a.requires_grad());
  EXPECT_FALSE(p.requires_grad());

  EXPECT_FALSE(b.requires_grad());
  torch::Tensor b2 = join(b, p);
  EXPECT_FALSE(b2.requires_grad());
  EXPECT_TRUE(b2.is_same(b));
}

TEST(DependencyTest, JoinWhenForkRequiresGrad) {
  torch::Tensor x = torch::rand({2, 1});
  auto chunks = x.chunk(2);
  torch::Tensor a = chunks[0], b = chunks[1];

  a.requires_grad_();
  EXPECT_TRUE(a.requires_grad());
  torch::Tensor p;
  std::tie(a, p) = fork(a);
  EXPECT_TRUE(a.requires_grad());
  EXPECT_TRUE(p.requires_grad());

  EXPECT_FALSE(b.requires_grad());
  b = join(b, p);
  EXPECT_TRUE(b.requires_grad());
  EXPECT_THAT(node_name(b), ::testing::HasSubstr("Join"));
}

TEST(DependencyTest, ForkJoinPassGradientsThrough) {
  torch::Tensor a = torch::rand({3}, torch::requires_grad());
  torch::Tensor b = torch::rand({3}, torch::requires_grad());

  auto [a2, phony] = fork(a * 2);
  torch::Tensor b2 = join(b * 3, phony);
  EXPECT_TRUE(torch::equal(a2, a * 2));
  EXPECT_TRUE(torch::equal(b2, b * 3));

  (a2 * 5 + b2 * 7).sum().backward();
  EXPECT_TRUE(torch::allclose(a.grad(), torch::full({3}, 10.0f)));
  EXPECT_TRUE(torch::allclose(b.grad(), torch::full({3}, 21.0f)));
}

TEST(DependencyTest, JoinOnlyPhonyLaneReachesFork) {
  // The gradient of b' alone still runs fork's lane: its phony is an edge into it.
  std::vector<int> log;
  torch::Tensor a = torch::rand({1}, torch::requires_grad());
  torch::Tensor b = torch::rand({1}, torch::requires_grad());
  auto [a2, phony] = fork(Log::apply(&log, 1, a));
  torch::Tensor b2 = join(Log::apply(&log, 2, b), phony);
  // Only b2 is differentiated; a's lane runs for the phony's (empty) gradient.
  b2.backward();
  EXPECT_EQ(log, (std::vector<int>{2, 1}));
  EXPECT_TRUE(torch::equal(b.grad(), torch::ones({1})));
}

}  // namespace
}  // namespace dependency_test
}  // namespace gpipe

// Ports torchgpipe's tests/test_microbatch.py, plus the checks the C++ Batch adds.
#include "test_util.h"

#include "gpipe/microbatch.h"

#include <torch/torch.h>

#include <vector>

namespace gpipe {
namespace microbatch_test {
namespace {

using ::gpipe::testing::bitwise_equal;

// Returns its tensor unchanged.
struct TensorIdentityImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x; }
};
TORCH_MODULE(TensorIdentity);

// Returns its list unchanged.
struct ListIdentityImpl : torch::nn::Module {
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> xs) { return xs; }
};
TORCH_MODULE(ListIdentity);

// Multiplies a tensor by `factor`.
struct ScaleImpl : torch::nn::Module {
  explicit ScaleImpl(double factor) : factor(factor) {}
  torch::Tensor forward(torch::Tensor x) { return x * factor; }
  double factor;
};
TORCH_MODULE(Scale);

// Turns a list into its sum: list in, tensor out.
struct SumListImpl : torch::nn::Module {
  torch::Tensor forward(std::vector<torch::Tensor> xs) {
    torch::Tensor total = xs.at(0);
    for (size_t k = 1; k < xs.size(); ++k) total = total + xs[k];
    return total;
  }
};
TORCH_MODULE(SumList);

// Splits a tensor into (x, 2x): tensor in, list out.
struct DuplicateImpl : torch::nn::Module {
  std::vector<torch::Tensor> forward(torch::Tensor x) { return {x, x * 2}; }
};
TORCH_MODULE(Duplicate);

// Returns something that is neither a Tensor nor a list of them.
struct ReturnsIntImpl : torch::nn::Module {
  int64_t forward(torch::Tensor x) { return x.numel(); }
};
TORCH_MODULE(ReturnsInt);

TEST(MicrobatchTest, BatchAtomic) {
  torch::Tensor x = torch::tensor(42);
  Batch b(x);

  EXPECT_TRUE(b.atomic());
  EXPECT_TRUE(b.tensor().is_same(x));
  // Unlike torchgpipe's AttributeError, tensors() of an atomic batch is the one tensor.
  ASSERT_EQ(b.tensors().size(), 1u);
  EXPECT_TRUE(b.tensors()[0].is_same(x));

  std::vector<torch::Tensor> listed(b.begin(), b.end());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].is_same(x));
  EXPECT_EQ(b.size(), 1u);
  EXPECT_TRUE(b[0].is_same(x));
}

TEST(MicrobatchTest, BatchNonAtomic) {
  torch::Tensor x = torch::tensor(42), y = torch::tensor(21);
  Batch b(std::vector<torch::Tensor>{x, y});

  EXPECT_FALSE(b.atomic());
  GPIPE_EXPECT_THROW_WITH(b.tensor(), c10::TypeError, "not an atomic batch");
  GPIPE_EXPECT_THROW_WITH(b.tensor(), c10::TypeError, "2 tensors");
  ASSERT_EQ(b.tensors().size(), 2u);
  EXPECT_TRUE(b.tensors()[0].is_same(x));
  EXPECT_TRUE(b.tensors()[1].is_same(y));

  std::vector<torch::Tensor> listed(b.begin(), b.end());
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_TRUE(listed[0].is_same(x));
  EXPECT_TRUE(listed[1].is_same(y));
  EXPECT_EQ(b.size(), 2u);
  EXPECT_TRUE(b[0].is_same(x));
  EXPECT_TRUE(b[1].is_same(y));
}

TEST(MicrobatchTest, BatchOfOneListIsNotAtomic) {
  torch::Tensor x = torch::tensor(42);
  Batch b(std::vector<torch::Tensor>{x});
  EXPECT_FALSE(b.atomic());
  EXPECT_EQ(b.size(), 1u);
  EXPECT_TRUE(b[0].is_same(x));
  EXPECT_THROW(b.tensor(), c10::TypeError);
}

TEST(MicrobatchTest, BatchCall) {
  Batch a(torch::tensor(42));
  Batch b(std::vector<torch::Tensor>{torch::tensor(42), torch::tensor(21)});

  torch::nn::Sequential tensor_identity(TensorIdentity{});
  torch::nn::Sequential list_identity(ListIdentity{});

  Batch a_out = a.call(tensor_identity);
  EXPECT_TRUE(a_out.atomic());
  EXPECT_TRUE(a_out.tensor().is_same(a.tensor()));

  Batch b_out = b.call(list_identity);
  EXPECT_FALSE(b_out.atomic());
  ASSERT_EQ(b_out.size(), 2u);
  EXPECT_EQ(b_out[0].item<int64_t>(), 42);
  EXPECT_EQ(b_out[1].item<int64_t>(), 21);
}

TEST(MicrobatchTest, BatchCallChainsLayers) {
  // tensor -> list -> tensor -> tensor: every layer gets what the previous one returned.
  torch::nn::Sequential layers(Duplicate{}, SumList{}, Scale(10.0));
  Batch out = Batch(torch::tensor({1.0, 2.0})).call(layers);
  ASSERT_TRUE(out.atomic());
  EXPECT_TRUE(torch::equal(out.tensor(), torch::tensor({30.0, 60.0})));

  // tensor -> list: an atomic input may give a list output.
  torch::nn::Sequential split(Duplicate{});
  Batch listed = Batch(torch::tensor({1.0})).call(split);
  EXPECT_FALSE(listed.atomic());
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[1].item<double>(), 2.0);
}

TEST(MicrobatchTest, BatchCallErrors) {
  torch::nn::Sequential empty;
  GPIPE_EXPECT_THROW_WITH(Batch(torch::ones({1})).call(empty, "partition 3"), c10::ValueError,
                          "cannot call partition 3: it has no layers");

  torch::nn::Sequential returns_int(ReturnsInt{});
  GPIPE_EXPECT_THROW_WITH(Batch(torch::ones({1})).call(returns_int, "partition 2"), c10::TypeError,
                          "expected Tensor or std::vector<Tensor>, but got");
  GPIPE_EXPECT_THROW_WITH(Batch(torch::ones({1})).call(returns_int, "partition 2"), c10::TypeError,
                          "from partition 2");
  GPIPE_EXPECT_THROW_WITH(Batch(torch::ones({1})).call(returns_int), c10::TypeError,
                          "from the module");
}

TEST(MicrobatchTest, BatchSetitemByIndex) {
  Batch a(torch::tensor(42));
  Batch b(std::vector<torch::Tensor>{torch::tensor(42), torch::tensor(21)});

  a[0] = torch::tensor(0);
  b[0] = torch::tensor(0);

  EXPECT_TRUE(a.atomic());
  EXPECT_EQ(a[0].item<int64_t>(), 0);
  EXPECT_EQ(a.tensor().item<int64_t>(), 0);

  EXPECT_FALSE(b.atomic());
  EXPECT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].item<int64_t>(), 0);
  EXPECT_EQ(b[1].item<int64_t>(), 21);
}

TEST(MicrobatchTest, BatchSetitemBySlice) {
  Batch a(torch::tensor(42));
  Batch b(std::vector<torch::Tensor>{torch::tensor(42), torch::tensor(21)});

  a.set_tensors({torch::tensor(0)});
  b.set_tensors({torch::tensor(0)});

  EXPECT_TRUE(a.atomic());
  EXPECT_EQ(a[0].item<int64_t>(), 0);

  EXPECT_FALSE(b.atomic());
  EXPECT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].item<int64_t>(), 0);

  // A list may also grow.
  b.set_tensors({torch::tensor(1), torch::tensor(2), torch::tensor(3)});
  EXPECT_FALSE(b.atomic());
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b[2].item<int64_t>(), 3);
}

TEST(MicrobatchTest, BatchSetTensorsKeepsAtomicity) {
  Batch a(torch::tensor(42));
  GPIPE_EXPECT_THROW_WITH(a.set_tensors({torch::tensor(1), torch::tensor(2)}), c10::IndexError,
                          "atomic batch cannot be replaced with multiple tensors (got 2)");
  GPIPE_EXPECT_THROW_WITH(a.set_tensors({}), c10::IndexError, "(got 0)");
  // A failed replacement leaves the batch as it was.
  EXPECT_TRUE(a.atomic());
  EXPECT_EQ(a.tensor().item<int64_t>(), 42);
}

TEST(MicrobatchTest, BatchIndexErrors) {
  Batch a(torch::tensor(42));
  GPIPE_EXPECT_THROW_WITH(a[1], c10::IndexError, "atomic batch allows index 0 only (index: 1)");
  const Batch& const_a = a;
  GPIPE_EXPECT_THROW_WITH(const_a[1], c10::IndexError, "index: 1");

  Batch b(std::vector<torch::Tensor>{torch::tensor(42), torch::tensor(21)});
  GPIPE_EXPECT_THROW_WITH(b[2], c10::IndexError,
                          "index 2 is out of range for a batch of 2 tensors");
  const Batch& const_b = b;
  GPIPE_EXPECT_THROW_WITH(const_b[5], c10::IndexError, "index 5 is out of range");
  EXPECT_EQ(const_b[1].item<int64_t>(), 21);

  Batch empty(std::vector<torch::Tensor>{});
  GPIPE_EXPECT_THROW_WITH(empty[0], c10::IndexError,
                          "index 0 is out of range for a batch of 0 tensors");
}

TEST(MicrobatchTest, Check) {
  // torchgpipe's check accepts 0-dim tensors; micro-batches need a dim 0 to split along, so the
  // C++ check asks for at least one dimension.
  EXPECT_NO_THROW(check(Batch(torch::ones({4}))));
  EXPECT_NO_THROW(check(Batch(std::vector<torch::Tensor>{torch::ones({4}), torch::ones({4, 2})})));
  EXPECT_NO_THROW(check(Batch(std::vector<torch::Tensor>{torch::ones({3, 1})})));
}

TEST(MicrobatchTest, CheckNoTensors) {
  GPIPE_EXPECT_THROW_WITH(check(Batch(std::vector<torch::Tensor>{})), c10::ValueError,
                          "expected at least one tensor in the input, but got none");
}

TEST(MicrobatchTest, CheckUndefined) {
  GPIPE_EXPECT_THROW_WITH(check(Batch(torch::Tensor())), c10::ValueError,
                          "input tensor 0 is undefined");
  GPIPE_EXPECT_THROW_WITH(
      check(Batch(std::vector<torch::Tensor>{torch::ones({2}), torch::Tensor()})), c10::ValueError,
      "input tensor 1 is undefined");
}

TEST(MicrobatchTest, CheckZeroDim) {
  GPIPE_EXPECT_THROW_WITH(check(Batch(torch::tensor(42))), c10::ValueError,
                          "input tensor 0 is 0-dimensional");
  GPIPE_EXPECT_THROW_WITH(check(Batch(std::vector<torch::Tensor>{torch::ones({2}), torch::ones({2}),
                                                                 torch::tensor(1.0)})),
                          c10::ValueError, "input tensor 2 is 0-dimensional (shape [])");
}

TEST(MicrobatchTest, CheckMismatchedBatchSizes) {
  GPIPE_EXPECT_THROW_WITH(
      check(Batch(
          std::vector<torch::Tensor>{torch::ones({4, 1}), torch::ones({4}), torch::ones({3, 4})})),
      c10::ValueError,
      "all input tensors must have the same batch size (dim 0), but tensor 0 has 4 and tensor 2 "
      "has 3");
}

TEST(MicrobatchTest, GatherTensors) {
  torch::Tensor a = torch::zeros({1, 1});
  torch::Tensor b = torch::ones({1, 1});

  Batch ab = gather({Batch(a), Batch(b)});

  ASSERT_TRUE(ab.atomic());
  EXPECT_EQ(ab.tensor().sizes(), (std::vector<int64_t>{2, 1}));
  // In micro-batch order.
  EXPECT_TRUE(torch::equal(ab.tensor(), torch::tensor({{0.0f}, {1.0f}})));
}

TEST(MicrobatchTest, GatherTuples) {
  std::vector<torch::Tensor> a{torch::zeros({1, 1}), torch::zeros({2, 2})};
  std::vector<torch::Tensor> b{torch::ones({1, 1}), torch::ones({2, 2})};

  Batch ab = gather({Batch(a), Batch(b)});

  ASSERT_FALSE(ab.atomic());
  ASSERT_EQ(ab.size(), 2u);
  EXPECT_EQ(ab[0].sizes(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(ab[1].sizes(), (std::vector<int64_t>{4, 2}));
  EXPECT_TRUE(torch::equal(ab[1], torch::cat({torch::zeros({2, 2}), torch::ones({2, 2})})));
}

TEST(MicrobatchTest, GatherOne) {
  torch::Tensor a = torch::rand({3, 2});
  Batch gathered = gather({Batch(a)});
  ASSERT_TRUE(gathered.atomic());
  EXPECT_TRUE(bitwise_equal(gathered.tensor(), a));

  Batch list = gather({Batch(std::vector<torch::Tensor>{a})});
  EXPECT_FALSE(list.atomic());
  EXPECT_TRUE(bitwise_equal(list[0], a));
}

TEST(MicrobatchTest, GatherMismatchedStructures) {
  torch::Tensor a = torch::zeros({1, 1});
  GPIPE_EXPECT_THROW_WITH(gather({Batch(a), Batch(std::vector<torch::Tensor>{a, a})}),
                          c10::TypeError,
                          "micro-batch outputs differ in structure: micro-batch 0 gave a Tensor "
                          "but micro-batch 1 gave a list of 2 tensors");
  GPIPE_EXPECT_THROW_WITH(
      gather({Batch(std::vector<torch::Tensor>{a, a}), Batch(std::vector<torch::Tensor>{a, a}),
              Batch(std::vector<torch::Tensor>{a})}),
      c10::TypeError,
      "micro-batch 0 gave a list of 2 tensors but micro-batch 2 gave a list of 1 tensors");
  // A list of one is not a Tensor either.
  GPIPE_EXPECT_THROW_WITH(gather({Batch(std::vector<torch::Tensor>{a}), Batch(a)}), c10::TypeError,
                          "micro-batch 1 gave a Tensor");
}

TEST(MicrobatchTest, GatherKeepsGradients) {
  torch::Tensor a = torch::rand({1, 2}, torch::requires_grad());
  torch::Tensor b = torch::rand({2, 2}, torch::requires_grad());
  Batch ab = gather({Batch(a * 2), Batch(b * 3)});
  ASSERT_TRUE(ab.tensor().requires_grad());
  ab.tensor().sum().backward();
  EXPECT_TRUE(torch::equal(a.grad(), torch::full({1, 2}, 2.0f)));
  EXPECT_TRUE(torch::equal(b.grad(), torch::full({2, 2}, 3.0f)));
}

TEST(MicrobatchTest, ScatterTensor) {
  torch::Tensor ab = torch::tensor({{1.0f}, {2.0f}});

  std::vector<Batch> batches = scatter(Batch(ab), 2);

  ASSERT_EQ(batches.size(), 2u);
  ASSERT_TRUE(batches[0].atomic());
  ASSERT_TRUE(batches[1].atomic());
  EXPECT_EQ(batches[0].tensor().sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(batches[1].tensor().sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(batches[0].tensor().item<float>(), 1.0f);
  EXPECT_EQ(batches[1].tensor().item<float>(), 2.0f);
}

TEST(MicrobatchTest, ScatterTuple) {
  // torchgpipe scatters (zeros(2, 1), zeros(4, 2)); the C++ check() requires one batch size, so
  // the second tensor here has batch size 2 and a wider row instead.
  std::vector<torch::Tensor> ab{torch::arange(2).view({2, 1}), torch::arange(4).view({2, 2})};

  std::vector<Batch> batches = scatter(Batch(ab), 2);

  ASSERT_EQ(batches.size(), 2u);
  const Batch& a = batches[0];
  const Batch& b = batches[1];
  ASSERT_FALSE(a.atomic());
  ASSERT_FALSE(b.atomic());
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(a.tensors()[0].sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(b.tensors()[0].sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(a.tensors()[1].sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(b.tensors()[1].sizes(), (std::vector<int64_t>{1, 2}));
  // Micro-batch k holds chunk k of every tensor.
  EXPECT_TRUE(torch::equal(a.tensors()[1], torch::tensor({{0, 1}})));
  EXPECT_TRUE(torch::equal(b.tensors()[0], torch::tensor({{1}})));
  EXPECT_TRUE(torch::equal(b.tensors()[1], torch::tensor({{2, 3}})));
}

TEST(MicrobatchTest, ScatterUneven) {
  // As torch::chunk: 5 into 4 gives 2, 2, 1.
  std::vector<Batch> batches = scatter(Batch(torch::arange(5)), 4);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_TRUE(torch::equal(batches[0].tensor(), torch::tensor({0, 1})));
  EXPECT_TRUE(torch::equal(batches[1].tensor(), torch::tensor({2, 3})));
  EXPECT_TRUE(torch::equal(batches[2].tensor(), torch::tensor({4})));

  // More chunks than samples: one micro-batch per sample.
  std::vector<Batch> singles = scatter(Batch(torch::arange(3)), 8);
  ASSERT_EQ(singles.size(), 3u);
  for (size_t k = 0; k < singles.size(); ++k) {
    EXPECT_EQ(singles[k].tensor().item<int64_t>(), static_cast<int64_t>(k));
  }

  std::vector<Batch> lists =
      scatter(Batch(std::vector<torch::Tensor>{torch::arange(5), torch::arange(5) * 10}), 4);
  ASSERT_EQ(lists.size(), 3u);
  EXPECT_EQ(lists[2].size(), 2u);
  EXPECT_TRUE(torch::equal(lists[2][1], torch::tensor({40})));
}

TEST(MicrobatchTest, ScatterGatherRoundTrip) {
  torch::Tensor x = torch::rand({7, 3});
  torch::Tensor mask = torch::randint(0, 2, {7}, torch::kLong);
  for (int64_t chunks : {1, 2, 3, 7, 10}) {
    Batch gathered = gather(scatter(Batch(x), chunks));
    EXPECT_TRUE(bitwise_equal(gathered.tensor(), x)) << "chunks=" << chunks;

    Batch list = gather(scatter(Batch(std::vector<torch::Tensor>{x, mask}), chunks));
    ASSERT_FALSE(list.atomic());
    EXPECT_TRUE(bitwise_equal(list[0], x)) << "chunks=" << chunks;
    EXPECT_TRUE(bitwise_equal(list[1], mask)) << "chunks=" << chunks;
  }
}

TEST(MicrobatchTest, ScatterKeepsGradients) {
  torch::Tensor x = torch::rand({4, 2}, torch::requires_grad());
  std::vector<Batch> batches = scatter(Batch(x), 2);
  ASSERT_EQ(batches.size(), 2u);
  (batches[0].tensor().sum() * 2 + batches[1].tensor().sum() * 3).backward();
  torch::Tensor expected = torch::cat({torch::full({2, 2}, 2.0f), torch::full({2, 2}, 3.0f)});
  EXPECT_TRUE(torch::equal(x.grad(), expected));
}

}  // namespace
}  // namespace microbatch_test
}  // namespace gpipe

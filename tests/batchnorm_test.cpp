#include "test_util.h"

#include "gpipe/batchnorm.h"
#include "gpipe/pipe.h"
#include "gpipe/schedule/runtime.h"

#include <cmath>

namespace gpipe {
namespace batchnorm_test {
namespace {

constexpr int64_t kChunks = 4;

// Variance tilted by channel, mean by sample: statistics far from those of any micro-batch.
// Comparisons at 1e-6 run in double: in float32 the plain BatchNorm's own rounding (a variance
// of values near 2^15) exceeds that, and such a test fails at random.
class DoublePrecision {
 public:
  DoublePrecision() : previous_(torch::get_default_dtype()) {
    torch::set_default_dtype(caffe2::TypeMeta::Make<double>());
  }
  ~DoublePrecision() { torch::set_default_dtype(previous_); }

 private:
  caffe2::TypeMeta previous_;
};

torch::Tensor tilt_dist(torch::Tensor input) {
  torch::NoGradGuard no_grad;
  auto rgb = input.transpose(0, 1);
  rgb[1] *= 10;
  rgb[2] *= 100;
  for (int64_t i = 0; i < input.size(0); ++i) input[i] += std::pow(2.0, static_cast<double>(i));
  return input;
}

template <typename Module>
torch::Tensor chunked_forward(Module& module, const torch::Tensor& input, int64_t chunks) {
  std::vector<torch::Tensor> outputs;
  for (const auto& chunk : input.chunk(chunks)) outputs.push_back(module->forward(chunk));
  return torch::cat(outputs);
}

::testing::AssertionResult close(const torch::Tensor& a, const torch::Tensor& b, double rtol,
                                 double atol) {
  if (a.sizes() == b.sizes() && torch::allclose(a, b, rtol, atol)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "max |a - b| = " << (a - b).abs().max().item<double>()
                                       << "\na = " << a << "\nb = " << b;
}

TEST(DeferredBatchNormTest, Transparency) {
  DoublePrecision precision;
  for (const int64_t chunks : {1, 4}) {
    for (const bool input_requires_grad : {true, false}) {
      SCOPED_TRACE("chunks " + std::to_string(chunks) + ", input_requires_grad " +
                   std::to_string(input_requires_grad));
      torch::manual_seed(0);
      torch::nn::BatchNorm2d bn(3);
      DeferredBatchNorm dbn(*bn->clone()->as<torch::nn::BatchNorm2d>(), chunks);

      auto input1 = tilt_dist(torch::rand({16, 3, 16, 16}));
      auto input2 = input1.clone();
      input1.requires_grad_(input_requires_grad);
      input2.requires_grad_(input_requires_grad);

      auto output1 = chunked_forward(bn, input1, chunks);
      auto output2 = chunked_forward(dbn, input2, chunks);
      EXPECT_TRUE(close(output1, output2, 1e-5, 1e-5));

      output1.mean().backward();
      output2.mean().backward();
      EXPECT_TRUE(close(bn->weight.grad(), dbn->weight.grad(), 1e-5, 1e-6));
      EXPECT_TRUE(close(bn->bias.grad(), dbn->bias.grad(), 1e-5, 1e-6));
      if (input_requires_grad) {
        ASSERT_TRUE(input1.grad().defined());
        ASSERT_TRUE(input2.grad().defined());
        EXPECT_TRUE(close(input1.grad(), input2.grad(), 1e-5, 1e-9));
      }
    }
  }
}

// One training step of a BatchNorm on the whole batch and of a DeferredBatchNorm on chunks:
// equal running statistics (to 1e-6) and equal eval outputs.
TEST(DeferredBatchNormTest, RunningStats) {
  DoublePrecision precision;
  for (const int64_t chunks : {1, 4}) {
    for (const bool cumulative : {false, true}) {
      SCOPED_TRACE("chunks " + std::to_string(chunks) + (cumulative ? ", cumulative" : ""));
      auto options = torch::nn::BatchNorm2dOptions(3);
      if (cumulative) options.momentum(c10::nullopt);
      torch::nn::BatchNorm2d bn(options);
      DeferredBatchNorm dbn(*bn->clone()->as<torch::nn::BatchNorm2d>(), chunks);

      const auto input = tilt_dist(torch::rand({16, 3, 32, 32}));
      bn->forward(input).sum().backward();
      chunked_forward(dbn, input, chunks).sum().backward();
      EXPECT_EQ(dbn->tracked(), 0);

      EXPECT_TRUE(close(bn->running_mean, dbn->running_mean, 1e-6, 1e-6));
      EXPECT_TRUE(close(bn->running_var, dbn->running_var, 1e-6, 1e-6));
      EXPECT_EQ(dbn->num_batches_tracked.item<int64_t>(), 1);
      EXPECT_FALSE(close(dbn->running_mean, torch::zeros({3}), 1e-6, 1e-6));  // it moved

      bn->eval();
      dbn->eval();
      EXPECT_TRUE(close(bn->forward(input), dbn->forward(input), 1e-5, 1e-5));
    }
  }
}

TEST(DeferredBatchNormTest, RunningStatsMomentumOverSteps) {
  DoublePrecision precision;
  torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(3).momentum(c10::nullopt));
  DeferredBatchNorm dbn(*bn->clone()->as<torch::nn::BatchNorm2d>(), kChunks);
  for (int step = 0; step < 3; ++step) {
    const auto input = tilt_dist(torch::rand({8, 3, 8, 8}));
    bn->forward(input);
    chunked_forward(dbn, input, kChunks);
  }
  EXPECT_EQ(dbn->num_batches_tracked.item<int64_t>(), 3);
  EXPECT_TRUE(close(bn->running_mean, dbn->running_mean, 1e-6, 1e-6));
  EXPECT_TRUE(close(bn->running_var, dbn->running_var, 1e-6, 1e-6));
}

TEST(DeferredBatchNormTest, BatchNorm1dAnd3d) {
  DoublePrecision precision;
  torch::nn::BatchNorm1d bn1(5);
  DeferredBatchNorm dbn1(*bn1->clone()->as<torch::nn::BatchNorm1d>(), kChunks);
  const auto x1 = torch::randn({12, 5}) * 3 + 1;  // 2D input
  bn1->forward(x1);
  chunked_forward(dbn1, x1, kChunks);
  EXPECT_TRUE(close(bn1->running_mean, dbn1->running_mean, 1e-6, 1e-6));
  EXPECT_TRUE(close(bn1->running_var, dbn1->running_var, 1e-6, 1e-6));

  torch::nn::BatchNorm3d bn3(2);
  DeferredBatchNorm dbn3(*bn3->clone()->as<torch::nn::BatchNorm3d>(), kChunks);
  const auto x3 = torch::randn({8, 2, 3, 4, 5}) * 2 - 5;
  bn3->forward(x3);
  chunked_forward(dbn3, x3, kChunks);
  EXPECT_TRUE(close(bn3->running_mean, dbn3->running_mean, 1e-6, 1e-6));
  EXPECT_TRUE(close(bn3->running_var, dbn3->running_var, 1e-6, 1e-6));
}

TEST(DeferredBatchNormTest, BeginMinibatch) {
  torch::nn::BatchNorm2d bn(3);
  DeferredBatchNorm dbn(*bn->clone()->as<torch::nn::BatchNorm2d>(), kChunks);
  const auto input = tilt_dist(torch::rand({6, 3, 4, 4}));

  dbn->forward(input.narrow(0, 0, 2));  // left over from an abandoned mini-batch: dropped
  dbn->begin_minibatch(3);
  EXPECT_EQ(dbn->tracked(), 0);
  chunked_forward(dbn, input, 3);
  EXPECT_EQ(dbn->tracked(), 0);
  bn->forward(input);
  EXPECT_TRUE(close(bn->running_mean, dbn->running_mean, 1e-6, 1e-6));
  EXPECT_TRUE(close(bn->running_var, dbn->running_var, 1e-6, 1e-6));

  // Back to chunks micro-batches afterwards.
  dbn->forward(input.narrow(0, 0, 2));
  dbn->forward(input.narrow(0, 2, 2));
  dbn->forward(input.narrow(0, 4, 2));
  EXPECT_EQ(dbn->tracked(), 3);
  GPIPE_EXPECT_THROW_WITH(dbn->begin_minibatch(0), c10::ValueError, "microbatches: 0");
}

TEST(DeferredBatchNormTest, Convert) {
  torch::nn::BatchNorm2d untracked(torch::nn::BatchNorm2dOptions(3).track_running_stats(false));
  torch::nn::BatchNorm2d bn(3);
  DeferredBatchNorm same(DeferredBatchNormOptions(3).chunks(kChunks));
  DeferredBatchNorm other(DeferredBatchNormOptions(3).chunks(kChunks + 1));
  struct Owner : torch::nn::Module {  // calls its BatchNorm itself: cannot be converted
    Owner() { bn = register_module("bn", torch::nn::BatchNorm1d(2)); }
    torch::Tensor forward(const torch::Tensor& x) { return bn(x); }
    torch::nn::BatchNorm1d bn{nullptr};
  };
  auto owner = std::make_shared<Owner>();
  torch::nn::Sequential model(untracked, bn, same, other, owner, torch::nn::ReLU());

  auto converted = convert_deferred_batch_norm(model, kChunks);
  ASSERT_EQ(converted->size(), 6u);
  EXPECT_EQ(converted->named_children().keys(), model->named_children().keys());
  EXPECT_EQ(converted->ptr(0), untracked.ptr());  // does not track: kept
  auto deferred = converted->ptr<DeferredBatchNormImpl>(1);
  ASSERT_TRUE(deferred);
  EXPECT_EQ(deferred->options.chunks(), kChunks);
  EXPECT_EQ(deferred->weight.unsafeGetTensorImpl(), bn->weight.unsafeGetTensorImpl());
  EXPECT_EQ(deferred->running_mean.unsafeGetTensorImpl(), bn->running_mean.unsafeGetTensorImpl());
  EXPECT_EQ(deferred->num_batches_tracked.unsafeGetTensorImpl(),
            bn->num_batches_tracked.unsafeGetTensorImpl());
  EXPECT_EQ(converted->ptr(2), same.ptr());  // same chunks: kept
  auto again = converted->ptr<DeferredBatchNormImpl>(3);
  ASSERT_TRUE(again);
  EXPECT_NE(again.get(), other.get());  // other chunks: replaced, sharing its tensors
  EXPECT_EQ(again->options.chunks(), kChunks);
  EXPECT_EQ(other->options.chunks(), kChunks + 1);
  EXPECT_EQ(again->running_var.unsafeGetTensorImpl(), other->running_var.unsafeGetTensorImpl());
  EXPECT_EQ(converted->ptr(4), model->ptr(4));  // kept, with a warning
  EXPECT_EQ(converted->ptr(5), model->ptr(5));

  // Parameters keep their names.
  EXPECT_EQ(converted->named_parameters().keys(), model->named_parameters().keys());
  EXPECT_EQ(converted->named_buffers().keys(), model->named_buffers().keys());
  GPIPE_EXPECT_THROW_WITH(convert_deferred_batch_norm(model, 0), c10::ValueError, "chunks: 0");
}

TEST(DeferredBatchNormTest, InputRequiringGrad) {
  DeferredBatchNorm dbn(DeferredBatchNormOptions(3).chunks(kChunks));
  const auto input = tilt_dist(torch::rand({16, 3, 8, 8})).requires_grad_();
  chunked_forward(dbn, input, kChunks);
  EXPECT_FALSE(dbn->running_mean.requires_grad());
  EXPECT_FALSE(dbn->running_var.requires_grad());
  EXPECT_FALSE(dbn->running_mean.grad_fn());
}

TEST(DeferredBatchNormTest, Optimize) {
  torch::manual_seed(0);
  torch::nn::BatchNorm2d bn(3);
  DeferredBatchNorm dbn(*bn->clone()->as<torch::nn::BatchNorm2d>(), kChunks);
  // Not shared: clone gave the BatchNorm's copy its own tensors.
  std::vector<torch::Tensor> parameters = bn->parameters();
  for (const auto& p : dbn->parameters()) parameters.push_back(p);
  torch::optim::SGD sgd(parameters, torch::optim::SGDOptions(1.0));
  for (int i = 0; i < 5; ++i) {
    bn->train();
    dbn->train();
    const auto input = tilt_dist(torch::rand({16, 3, 16, 16}));
    bn->forward(input).sum().backward();
    chunked_forward(dbn, input, kChunks).sum().backward();
    sgd.step();
    bn->eval();
    dbn->eval();
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(close(bn->forward(input), dbn->forward(input), 0, 1e-1 * std::pow(10, i))) << i;
  }
}

TEST(DeferredBatchNormTest, ConvBn) {
  torch::manual_seed(0);
  torch::nn::Sequential bn(torch::nn::Conv2d(3, 3, 1), torch::nn::BatchNorm2d(3));
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(bn->clone());
  auto dbn = convert_deferred_batch_norm(torch::nn::Sequential(copy), kChunks);
  const auto input = tilt_dist(torch::rand({16, 3, 16, 16}));

  std::vector<torch::Tensor> parameters = bn->parameters();
  for (const auto& p : dbn->parameters()) parameters.push_back(p);
  torch::optim::SGD sgd(parameters, torch::optim::SGDOptions(0.1));

  auto a = bn->forward(input);
  auto b = chunked_forward(dbn, input, kChunks);
  EXPECT_FALSE(torch::allclose(a, b));  // per mini-batch vs per micro-batch normalization
  a.sum().backward();
  b.sum().backward();
  sgd.step();
  sgd.zero_grad();
  // The convolutions train differently, yet the running statistics of the first step agree.
  EXPECT_FALSE(torch::allclose(bn[0]->as<torch::nn::Conv2d>()->weight,
                               dbn[0]->as<torch::nn::Conv2d>()->weight));
  const auto& bn1 = *bn[1]->as<torch::nn::BatchNorm2d>();
  const auto& dbn1 = *dbn->ptr<DeferredBatchNormImpl>(1);
  EXPECT_TRUE(close(bn1.running_mean, dbn1.running_mean, 1e-6, 1e-6));
  EXPECT_TRUE(close(bn1.running_var, dbn1.running_var, 1e-6, 1e-6));

  // After the second step they differ, because the convolutions do.
  bn->forward(input);
  chunked_forward(dbn, input, kChunks);
  EXPECT_FALSE(torch::allclose(bn1.running_mean, dbn1.running_mean, 1e-4, 1e-4));
}

TEST(DeferredBatchNormTest, Errors) {
  DeferredBatchNorm dbn(3);
  GPIPE_EXPECT_THROW_WITH(dbn->forward(torch::rand({3})), c10::ValueError,
                          "expected at least 2D input (got 1D input)");
  GPIPE_EXPECT_THROW_WITH(dbn->forward(torch::rand({4, 2, 5})), c10::ValueError,
                          "expected input with 3 channels");
  GPIPE_EXPECT_THROW_WITH(DeferredBatchNorm(DeferredBatchNormOptions(3).chunks(0)), c10::ValueError,
                          "chunks: 0");
  torch::nn::BatchNorm2d untracked(torch::nn::BatchNorm2dOptions(3).track_running_stats(false));
  GPIPE_EXPECT_THROW_WITH(DeferredBatchNorm(*untracked, 2), c10::ValueError,
                          "does not track running statistics");
}

TEST(DeferredBatchNormTest, Clone) {
  DeferredBatchNorm dbn(DeferredBatchNormOptions(3).chunks(2));
  auto copy = std::dynamic_pointer_cast<DeferredBatchNormImpl>(dbn->clone());
  ASSERT_TRUE(copy);
  EXPECT_NE(copy->running_mean.unsafeGetTensorImpl(), dbn->running_mean.unsafeGetTensorImpl());
  copy->forward(torch::rand({4, 3, 2}) + 5);
  copy->forward(torch::rand({4, 3, 2}) + 5);
  EXPECT_EQ(copy->num_batches_tracked.item<int64_t>(), 1);
  EXPECT_EQ(dbn->num_batches_tracked.item<int64_t>(), 0);
  EXPECT_TRUE(testing::bitwise_equal(dbn->running_mean, torch::zeros({3})));
}

// GPipe with deferred_batch_norm(true): after one training step, the running statistics are
// those of a plain BatchNorm on the whole batch, whatever is checkpointed (a recomputation
// must not track its micro-batch again).
TEST(GPipeDeferredBatchNormTest, RunningStats) {
  DoublePrecision precision;
  for (const auto mode :
       {CheckpointMode::kAlways, CheckpointMode::kExceptLast, CheckpointMode::kNever}) {
    SCOPED_TRACE(c10::str("checkpoint ", mode));
    torch::nn::BatchNorm2d bn(3);
    torch::nn::Sequential sequential(torch::nn::Conv2d(3, 3, 1), torch::nn::BatchNorm2d(3),
                                     torch::nn::ReLU());
    // The same convolution in front of both, so that the BatchNorms see the same input.
    auto conv = sequential[0]->as<torch::nn::Conv2d>();
    GPipe model(sequential,
                GPipeOptions({2, 1}).chunks(kChunks).checkpoint(mode).deferred_batch_norm(true));
    auto deferred = model->ptr<DeferredBatchNormImpl>(1);
    ASSERT_TRUE(deferred);

    for (int step = 0; step < 2; ++step) {
      const auto input = tilt_dist(torch::rand({16, 3, 8, 8}));
      model->forward(input).mean().backward();
      EXPECT_EQ(deferred->tracked(), 0);  // nothing tracked again by the recomputations
      torch::NoGradGuard no_grad;
      bn->forward(conv->forward(input));
    }
    EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), 2);
    EXPECT_TRUE(close(deferred->running_mean, bn->running_mean, 1e-6, 1e-6));
    EXPECT_TRUE(close(deferred->running_var, bn->running_var, 1e-6, 1e-6));
  }
}

TEST(GPipeDeferredBatchNormTest, FewerMicrobatchesThanChunks) {
  DoublePrecision precision;
  torch::nn::BatchNorm2d bn(3);
  torch::nn::Sequential sequential(torch::nn::BatchNorm2d(3));
  GPipe model(sequential, GPipeOptions({1}).chunks(kChunks).deferred_batch_norm(true));
  auto deferred = model->ptr<DeferredBatchNormImpl>(0);
  ASSERT_TRUE(deferred);

  const auto small = tilt_dist(torch::rand({6, 3, 4, 4}));  // chunks into 3 micro-batches
  model->forward(small).mean().backward();
  bn->forward(small);
  EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), 1);
  EXPECT_TRUE(close(deferred->running_mean, bn->running_mean, 1e-6, 1e-6));
  EXPECT_TRUE(close(deferred->running_var, bn->running_var, 1e-6, 1e-6));

  const auto full = tilt_dist(torch::rand({8, 3, 4, 4}));
  model->forward(full).mean().backward();
  bn->forward(full);
  EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), 2);
  EXPECT_TRUE(close(deferred->running_mean, bn->running_mean, 1e-6, 1e-6));
  EXPECT_TRUE(close(deferred->running_var, bn->running_var, 1e-6, 1e-6));

  // Eval: no tracking, normalized by the running statistics.
  model->eval();
  bn->eval();
  EXPECT_TRUE(close(model->forward(full), bn->forward(full), 1e-5, 1e-5));
  EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), 2);
}

// The schedule engines tell the stages' DeferredBatchNorms how many micro-batches a step has,
// as GPipe does: a small batch still commits its statistics, under every schedule and
// checkpoint mode.
TEST(ScheduleDeferredBatchNormTest, FewerMicrobatchesThanChunks) {
  DoublePrecision precision;
  using schedule::ScheduleKind;
  for (const auto kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
    for (const auto mode :
         {CheckpointMode::kAlways, CheckpointMode::kExceptLast, CheckpointMode::kNever}) {
      if (kind == ScheduleKind::kZeroBubble && mode != CheckpointMode::kNever) continue;
      SCOPED_TRACE(c10::str("schedule ", kind, ", checkpoint ", mode));
      torch::nn::BatchNorm2d bn(3);
      torch::nn::Sequential sequential = convert_deferred_batch_norm(
          torch::nn::Sequential(torch::nn::Conv2d(3, 3, 1), torch::nn::BatchNorm2d(3),
                                torch::nn::ReLU()),
          kChunks);
      auto conv = sequential[0]->as<torch::nn::Conv2d>();
      auto deferred = sequential->ptr<DeferredBatchNormImpl>(1);
      ASSERT_TRUE(deferred);
      schedule::PipelineSchedule pipe(
          sequential, {1, 2},
          [](const Batch& output, const Batch& target) {
            return torch::mse_loss(output.tensor(), target.tensor());
          },
          schedule::PipelineScheduleOptions(kChunks).schedule(kind).checkpoint(mode));

      const auto small = tilt_dist(torch::rand({6, 3, 4, 4}));  // 3 micro-batches of 4
      pipe.step(small, torch::zeros({6, 3, 4, 4}));
      torch::NoGradGuard no_grad;
      bn->forward(conv->forward(small));
      EXPECT_EQ(deferred->tracked(), 0);
      EXPECT_EQ(deferred->num_batches_tracked.item<int64_t>(), 1);
      EXPECT_TRUE(close(deferred->running_mean, bn->running_mean, 1e-6, 1e-6));
      EXPECT_TRUE(close(deferred->running_var, bn->running_var, 1e-6, 1e-6));
    }
  }
}

TEST(GPipeDeferredBatchNormTest, Params) {
  for (const auto mode : {CheckpointMode::kNever, CheckpointMode::kAlways}) {
    torch::nn::BatchNorm2d bn(3);
    auto copy = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(bn->clone());
    GPipe model(torch::nn::Sequential(torch::nn::BatchNorm2d(copy)),
                GPipeOptions({1}).chunks(1).checkpoint(mode).deferred_batch_norm(true));
    const auto x = torch::rand({4, 3, 10, 10});
    model->forward(x).mean().backward();
    bn->forward(x).mean().backward();
    auto deferred = model->ptr<DeferredBatchNormImpl>(0);
    ASSERT_TRUE(deferred);
    ASSERT_TRUE(deferred->weight.grad().defined());
    ASSERT_TRUE(deferred->bias.grad().defined());
    EXPECT_TRUE(close(deferred->weight.grad(), bn->weight.grad(), 1e-5, 1e-6));
    EXPECT_TRUE(close(deferred->bias.grad(), bn->bias.grad(), 1e-5, 1e-6));
  }
}

TEST(GPipeDeferredBatchNormTest, OffByDefault) {
  GPipe model(torch::nn::Sequential(torch::nn::BatchNorm2d(3)), GPipeOptions({1}).chunks(2));
  EXPECT_TRUE(model->ptr<torch::nn::BatchNorm2dImpl>(0));
  EXPECT_FALSE(model->ptr<DeferredBatchNormImpl>(0));
}

}  // namespace
}  // namespace batchnorm_test
}  // namespace gpipe

// Skip connections in explicit schedules: within a stage they work as in a plain Sequential;
// between stages they travel straight from the stashing stage to the popping one.
#include "test_util.h"

#include "distributed_model.h"
#include "gpipe/schedule/generators.h"
#include "gpipe/schedule/runtime.h"
#include "gpipe/schedule/thread_transport.h"
#include "gpipe/skip/skippable.h"
#include "models/resnet.h"
#include "models/unet.h"
#include "schedule/run_actions.h"

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

namespace gpipe {
namespace schedule {
namespace skip_schedule_test {
namespace {

using torch::nn::Sequential;

struct StashImpl : torch::nn::Module, skip::Skippable {
  StashImpl() : Skippable({"skip"}, {}) {}
  torch::Tensor forward(torch::Tensor input) {
    stash("skip", input);
    return input;
  }
};
TORCH_MODULE(Stash);

struct AddImpl : torch::nn::Module, skip::Skippable {
  AddImpl() : Skippable({}, {"skip"}) {}
  torch::Tensor forward(torch::Tensor input) { return input + pop("skip"); }
};
TORCH_MODULE(Add);

at::Tensor mse(const Batch& output, const Batch& target) {
  return torch::mse_loss(output.tensor(), target.tensor());
}

Sequential residual_model() {
  torch::manual_seed(0);
  auto model = Sequential(Stash(), torch::nn::Linear(4, 4), torch::nn::Tanh(), Add(),
                          torch::nn::Linear(4, 2));
  model->to(torch::kDouble);
  return model;
}

// residual_model() behind a Linear(4, 4): with balance {1, 4, 1} the skip lies in a middle
// stage, whose backward ZB1P splits.
Sequential prefixed_residual_model() {
  auto residual = residual_model();
  torch::manual_seed(1);
  Sequential model(torch::nn::Linear(4, 4));
  for (const auto& layer : *residual) model->push_back(layer);
  model->to(torch::kDouble);
  return model;
}

TEST(SkipScheduleTest, SkipWithinAStage) {
  const auto input = torch::randn({8, 4}, torch::kDouble);
  const auto target = torch::randn({8, 2}, torch::kDouble);
  for (const bool prefixed : {false, true}) {
    auto plain = prefixed ? prefixed_residual_model() : residual_model();
    const auto expected = torch::mse_loss(plain->forward(input), target);
    expected.backward();
    const std::vector<int64_t> balance =
        prefixed ? std::vector<int64_t>{1, 4, 1} : std::vector<int64_t>{4, 1};
    for (const auto kind :
         {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
      auto model = prefixed ? prefixed_residual_model() : residual_model();
      PipelineSchedule pipe(model, balance, mse, PipelineScheduleOptions(4).schedule(kind));
      EXPECT_TRUE(torch::allclose(pipe.step(input, target), expected, 1e-6, 1e-12)) << kind;
      const auto expected_parameters = plain->parameters();
      const auto parameters = model->parameters();
      for (size_t k = 0; k < parameters.size(); ++k) {
        EXPECT_TRUE(
            torch::allclose(parameters[k].grad(), expected_parameters[k].grad(), 1e-6, 1e-12))
            << kind << ", prefixed " << prefixed << ", parameter " << k;
      }
    }
  }
}

// The skip model of the process tests (distributed_model.h) on `stages` even stages: loss and
// every gradient equal the plain model's.
void expect_skips_equivalent(int64_t stages, const PipelineScheduleOptions& options,
                             const std::string& what) {
  const auto [input, target] = testing::distributed_batch();
  std::vector<int64_t> balance = testing::distributed_balance(stages);
  auto plain = testing::distributed_model(balance, -1, "", false, /*skips=*/true);
  const auto expected_loss = torch::mse_loss(plain->forward(input), target);
  expected_loss.backward();
  auto model = testing::distributed_model(balance, -1, "", false, /*skips=*/true);
  PipelineSchedule pipe(model, balance, mse, options);
  EXPECT_TRUE(torch::allclose(pipe.step(input, target), expected_loss, 1e-6, 1e-12)) << what;
  const auto expected = plain->parameters();
  const auto actual = model->parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t k = 0; k < actual.size(); ++k) {
    EXPECT_TRUE(torch::allclose(actual[k].grad(), expected[k].grad(), 1e-6, 1e-12))
        << what << ", parameter " << k;
  }
}

// Every schedule, 2..4 workers (2..8 stages: the skips cross 1 to 6 stages), 1..8 micro-batches.
TEST(SkipScheduleTest, SkipsAcrossStagesEveryScheduleEqualPlainModel) {
  for (const auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble,
                          ScheduleKind::kInterleavedOneFOneB, ScheduleKind::kInterleavedZeroBubble,
                          ScheduleKind::kLoopedBFS, ScheduleKind::kZeroBubbleV,
                          ScheduleKind::kDualPipeV, ScheduleKind::kVMin, ScheduleKind::kVHalf}) {
    const int64_t per_worker = kind == ScheduleKind::kGPipe || kind == ScheduleKind::kOneFOneB ||
                                       kind == ScheduleKind::kZeroBubble
                                   ? 1
                                   : 2;
    for (int64_t workers = 2 / per_worker; workers <= 4; ++workers) {
      for (int64_t chunks = min_microbatches(kind, workers * per_worker); chunks <= 8; ++chunks) {
        expect_skips_equivalent(
            workers * per_worker,
            PipelineScheduleOptions(chunks).schedule(kind).stages_per_worker(per_worker),
            c10::str(kind, ", ", workers, " workers, ", chunks, " chunks"));
      }
    }
  }
}

// A checkpointed forward recomputes the skips it pops and stashes with the rest.
TEST(SkipScheduleTest, CheckpointedSkipsAcrossStages) {
  for (const auto mode : {CheckpointMode::kAlways, CheckpointMode::kExceptLast}) {
    for (const auto kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
      for (const int64_t stages : {2, 4}) {
        expect_skips_equivalent(stages, PipelineScheduleOptions(4).schedule(kind).checkpoint(mode),
                                c10::str(kind, ", checkpoint ", mode, ", ", stages, " stages"));
      }
    }
  }
}

// Every schedule on 2 and 4 stages of one per worker, and 4 of two per worker.
const std::vector<std::pair<ScheduleKind, int64_t>> kSchedules{
    {ScheduleKind::kGPipe, 1},
    {ScheduleKind::kOneFOneB, 1},
    {ScheduleKind::kZeroBubble, 1},
    {ScheduleKind::kInterleavedOneFOneB, 2},
    {ScheduleKind::kInterleavedZeroBubble, 2},
    {ScheduleKind::kLoopedBFS, 2},
    {ScheduleKind::kZeroBubbleV, 2},
    {ScheduleKind::kDualPipeV, 2},
    {ScheduleKind::kVMin, 2},
    {ScheduleKind::kVHalf, 2}};

// `make()`'s model pipelined on `balance` under every schedule that runs that many stages gives
// the plain model's loss and gradients on (input, target).
void expect_model_equivalent(const std::function<Sequential()>& make,
                             const std::vector<int64_t>& balance, const at::Tensor& input,
                             const at::Tensor& target) {
  const int64_t stages = static_cast<int64_t>(balance.size());
  auto plain = make();
  const auto expected_loss = torch::mse_loss(plain->forward(input), target);
  expected_loss.backward();
  for (const auto& [kind, per_worker] : kSchedules) {
    if (per_worker == 2 && stages != 4) continue;
    SCOPED_TRACE(c10::str(kind, ", ", stages, " stages"));
    auto model = make();
    PipelineSchedule pipe(model, balance, mse,
                          PipelineScheduleOptions(4).schedule(kind).stages_per_worker(per_worker));
    EXPECT_TRUE(torch::allclose(pipe.step(input, target), expected_loss, 1e-6, 1e-12));
    const auto expected = plain->parameters();
    const auto actual = model->parameters();
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t k = 0; k < actual.size(); ++k) {
      EXPECT_TRUE(torch::allclose(actual[k].grad(), expected[k].grad(), 1e-6, 1e-12))
          << "parameter " << k;
    }
  }
}

// U-Net's long skips cross from each encoder to its decoder, over the stages between.
TEST(SkipScheduleTest, UNetEverySchedule) {
  const auto make = [] {
    torch::manual_seed(0);
    auto model =
        models::unet(models::UNetOptions().depth(2).num_convs(1).base_channels(4).dropout(0.0));
    model->to(torch::kDouble);
    return model;
  };
  torch::manual_seed(1);
  const auto input = torch::rand({8, 3, 8, 8}, torch::kDouble);
  const auto target = torch::rand({8, 1, 8, 8}, torch::kDouble);
  for (const auto& balance : std::vector<std::vector<int64_t>>{{10, 19}, {7, 7, 7, 8}}) {
    expect_model_equivalent(make, balance, input, target);
  }
}

// ResNet's residuals cut across stages mid-block (batch norms in eval mode: micro-batch
// statistics would differ from the full batch's by design).
TEST(SkipScheduleTest, ResNetEverySchedule) {
  const auto make = [] {
    torch::manual_seed(0);
    auto model = models::resnet(models::ResNetOptions({1, 1, 1, 1}).base_width(4).num_classes(5));
    model->to(torch::kDouble);
    model->eval();
    return model;
  };
  torch::manual_seed(1);
  const auto input = torch::rand({8, 3, 32, 32}, torch::kDouble);
  const auto target = torch::rand({8, 5}, torch::kDouble);
  for (const auto& balance : std::vector<std::vector<int64_t>>{{20, 31}, {13, 13, 13, 12}}) {
    expect_model_equivalent(make, balance, input, target);
  }
}

// Counts the bytes of every message by edge and lane on their way through a ThreadTransport.
class CountingTransport : public Transport {
 public:
  explicit CountingTransport(int64_t num_stages) : inner_(num_stages, 1024) {}

  void send(Batch batch, int64_t from, int64_t to, int64_t tag, Lane lane) override {
    int64_t bytes = 0;
    for (const auto& x : batch) bytes += x.defined() ? static_cast<int64_t>(x.nbytes()) : 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      bytes_[{from, to, lane}] += bytes;
    }
    inner_.send(std::move(batch), from, to, tag, lane);
  }
  Batch recv(int64_t from, int64_t to, int64_t tag, Lane lane) override {
    return inner_.recv(from, to, tag, lane);
  }
  void abort() override { inner_.abort(); }

  std::map<std::tuple<int64_t, int64_t, Lane>, int64_t> bytes() const { return bytes_; }

 private:
  ThreadTransport inner_;
  std::mutex mutex_;
  std::map<std::tuple<int64_t, int64_t, Lane>, int64_t> bytes_;
};

// The skips of distributed_model on 4 stages of 4 layers: "long" from stage 0 to stage 3 (7
// wide) and "short" from stage 0 to stage 2 (6 wide). Each goes straight there on the skip lane
// and its gradient straight back; the pipeline lane carries only the stages' own outputs, as
// wide as without skips (6, 4, 5), so nothing travels through the stages between.
TEST(SkipScheduleTest, SkipsTravelStraightToThePoppingStage) {
  const auto [input, target] = testing::distributed_batch();  // double
  std::vector<int64_t> balance = testing::distributed_balance(4);
  auto model = testing::distributed_model(balance, -1, "", false, /*skips=*/true);
  std::vector<Sequential> parts(4);
  size_t k = 0;
  for (const auto& layer : *model) parts[k++ / 4]->push_back(layer);
  const skip::SkipLayout layout = skip::inspect_skip_layout(parts);
  std::vector<std::unique_ptr<Stage>> stages;
  for (int64_t s = 0; s < 4; ++s) {
    stages.push_back(std::make_unique<Stage>(s, 4, parts[s], c10::Device(c10::kCPU),
                                             CheckpointMode::kNever, &layout));
    stages.back()->begin_step(4);
  }
  const std::vector<Batch> inputs = scatter(input, 4), targets = scatter(target, 4);
  const std::vector<double> scales{0.3, 0.3, 0.3, 0.1};
  const LossFunction loss = mse;
  const StepInputs step{inputs, targets, scales, loss};
  std::vector<at::Tensor> losses(4);
  CountingTransport transport(4);
  for (const auto kind : {ScheduleKind::kGPipe, ScheduleKind::kZeroBubble}) {
    const Schedule schedule = make_schedule(kind, 4, 4, 4);
    std::vector<std::thread> workers;
    for (int64_t w = 0; w < 4; ++w) {
      workers.emplace_back([&, w] {
        std::vector<Stage*> mine(4, nullptr);
        mine[w] = stages[w].get();
        run_actions(schedule.actions[w], mine, transport, step, losses);
      });
    }
    for (auto& worker : workers) worker.join();
    for (const auto& stage : stages) stage->begin_step(4);
  }
  const int64_t n = input.size(0) * 8 * 2;  // bytes of one double per row, two steps
  const std::map<std::tuple<int64_t, int64_t, Lane>, int64_t> expected{
      {{0, 1, Lane::kPipeline}, 6 * n}, {{1, 2, Lane::kPipeline}, 4 * n},
      {{2, 3, Lane::kPipeline}, 5 * n}, {{1, 0, Lane::kPipeline}, 6 * n},
      {{2, 1, Lane::kPipeline}, 4 * n}, {{3, 2, Lane::kPipeline}, 5 * n},
      {{0, 3, Lane::kSkip}, 7 * n},     {{3, 0, Lane::kSkip}, 7 * n},
      {{0, 2, Lane::kSkip}, 6 * n},     {{2, 0, Lane::kSkip}, 6 * n}};
  EXPECT_EQ(transport.bytes(), expected);
}

// Records the tensors it stashes and pops (as weak references), to see them freed.
std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> probed;

struct StashProbeImpl : torch::nn::Module, skip::Skippable {
  StashProbeImpl() : Skippable({"skip"}, {}) {}
  torch::Tensor forward(torch::Tensor input) {
    auto stashed = torch::tanh(input);
    probed.emplace_back(stashed.getIntrusivePtr());
    stash("skip", stashed);
    return input;
  }
};
TORCH_MODULE(StashProbe);

struct PopProbeImpl : torch::nn::Module, skip::Skippable {
  PopProbeImpl() : Skippable({}, {"skip"}) {}
  torch::Tensor forward(torch::Tensor input) {
    auto popped = pop("skip");
    probed.emplace_back(popped.getIntrusivePtr());
    return input + popped;
  }
};
TORCH_MODULE(PopProbe);

// Once a step is over, no stage, message or graph holds a skip's tensor, popped or stashed.
TEST(SkipScheduleTest, SkippedTensorsAreFreedAfterTheStep) {
  for (const auto kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubble}) {
    for (const auto mode : {CheckpointMode::kNever, CheckpointMode::kAlways}) {
      if (kind == ScheduleKind::kZeroBubble && mode == CheckpointMode::kAlways) continue;
      torch::manual_seed(0);
      Sequential model(StashProbe(), torch::nn::Linear(4, 4), torch::nn::Tanh(),
                       torch::nn::Linear(4, 4), PopProbe(), torch::nn::Linear(4, 2));
      model->to(torch::kDouble);
      PipelineSchedule pipe(model, {1, 3, 2}, mse,
                            PipelineScheduleOptions(4).schedule(kind).checkpoint(mode));
      probed.clear();
      pipe.step(torch::randn({8, 4}, torch::kDouble), torch::randn({8, 2}, torch::kDouble));
      ASSERT_GE(probed.size(), 8u) << kind;
      for (const auto& tensor : probed) EXPECT_TRUE(tensor.expired()) << kind << ", " << mode;
    }
  }
}

TEST(SkipScheduleTest, UnpairedSkipsAreRefused) {
  GPIPE_EXPECT_THROW_WITH(
      PipelineSchedule({Sequential(Stash(), torch::nn::Tanh()), Sequential(torch::nn::Tanh())}, mse,
                       PipelineScheduleOptions(2)),
      c10::TypeError, "no module declared 'skip' as poppable but stashed");
}

// Stashes a copy of its input, noting of each gradient that reaches the copy whether it has
// memory of its own or views a larger buffer.
struct WatchedStashImpl : torch::nn::Module, skip::Skippable {
  explicit WatchedStashImpl(std::shared_ptr<std::vector<bool>> owns)
      : Skippable({"skip"}, {}), owns(std::move(owns)) {}
  torch::Tensor forward(torch::Tensor input) {
    torch::Tensor copy = input * 1.0;
    copy.register_hook([owns = owns](const torch::Tensor& gradient) {
      owns->push_back(gradient.storage().nbytes() == gradient.nbytes());
    });
    stash("skip", copy);
    return input;
  }
  std::shared_ptr<std::vector<bool>> owns;
};
TORCH_MODULE(WatchedStash);

struct ConcatenateImpl : torch::nn::Module, skip::Skippable {
  ConcatenateImpl() : Skippable({}, {"skip"}) {}
  torch::Tensor forward(torch::Tensor input) { return torch::cat({input, pop("skip")}, 1); }
};
TORCH_MODULE(Concatenate);

// A concatenation's gradient is one buffer that its inputs' gradients view. The part that goes
// back to the stashing stage leaves as a copy, so that the buffer does not wait there with it;
// the gradients stay the plain model's.
TEST(SkipScheduleTest, GradientsSentUpstreamOwnTheirMemory) {
  const auto input = torch::randn({8, 4}, torch::kDouble);
  const auto target = torch::randn({8, 2}, torch::kDouble);
  const auto make = [](std::shared_ptr<std::vector<bool>> owns) {
    torch::manual_seed(0);
    auto model = Sequential(torch::nn::Linear(4, 4), WatchedStash(std::move(owns)),
                            torch::nn::Linear(4, 4), Concatenate(), torch::nn::Linear(8, 2));
    model->to(torch::kDouble);
    return model;
  };
  auto plain = make(std::make_shared<std::vector<bool>>());
  torch::mse_loss(plain->forward(input), target).backward();
  for (const auto kind : {ScheduleKind::kGPipe, ScheduleKind::kZeroBubble}) {
    const auto owns = std::make_shared<std::vector<bool>>();
    auto model = make(owns);
    PipelineSchedule pipe(model, {3, 2}, mse, PipelineScheduleOptions(2).schedule(kind));
    pipe.step(input, target);
    EXPECT_EQ(*owns, std::vector<bool>(2, true)) << kind;
    for (size_t k = 0; k < model->parameters().size(); ++k) {
      EXPECT_TRUE(torch::allclose(model->parameters()[k].grad(), plain->parameters()[k].grad(),
                                  1e-9, 1e-12))
          << kind;
    }
  }
}

}  // namespace
}  // namespace skip_schedule_test
}  // namespace schedule
}  // namespace gpipe

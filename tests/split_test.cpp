// Splitting a Sequential by a balance (src/split.h): one set of checks and messages, the same
// from every engine.
#include "test_util.h"

#include "detail/split.h"
#include "distributed_model.h"
#include "gpipe/distributed/pipeline_stage.h"
#include "gpipe/pipe.h"
#include "gpipe/schedule/runtime.h"

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace gpipe {
namespace split_test {
namespace {

using torch::nn::Linear;
using torch::nn::Sequential;

TEST(SplitTest, StagesShareTheLayersAndKeepTheirNames) {
  Sequential model;
  model->push_back("a", Linear(1, 2));
  model->push_back("b", torch::nn::ReLU());
  model->push_back("c", Linear(2, 3));
  auto stages = detail::split_by_balance(model, {2, 1});
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0]->named_children().keys(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(stages[1]->named_children().keys(), (std::vector<std::string>{"c"}));
  EXPECT_EQ(stages[0]->ptr(0), model->ptr(0));  // shared, not copied
  EXPECT_EQ(stages[1]->ptr(0), model->ptr(2));
  // Each layer keeps its own forward.
  const auto x = torch::rand({4, 1});
  EXPECT_TRUE(testing::bitwise_equal(stages[1]->forward(stages[0]->forward(x)), model->forward(x)));
  EXPECT_TRUE(detail::split_by_balance(Sequential(), {}).empty());
}

// The same mistake reads the same from GPipe, PipelineSchedule and PipelineStage.
TEST(SplitTest, EveryEngineHasTheSameChecks) {
  setenv("RANK", "0", 1);  // PipelineStage checks before any rendezvous
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1", 1);
  std::vector<int64_t> sixteen{8, 8};
  const Sequential model = testing::distributed_model(sixteen);
  const auto loss = [](const Batch& y, const Batch& t) {
    return torch::mse_loss(y.tensor(), t.tensor());
  };
  const std::vector<std::function<void(const std::vector<int64_t>&)>> engines{
      [&](const std::vector<int64_t>& balance) { GPipe(model, GPipeOptions(balance)); },
      [&](const std::vector<int64_t>& balance) {
        schedule::PipelineSchedule(model, balance, loss, schedule::PipelineScheduleOptions(2));
      },
      [&](const std::vector<int64_t>& balance) {
        distributed::PipelineStage(model, balance, loss, distributed::PipelineStageOptions(2));
      },
  };
  for (const auto k : c10::irange(engines.size())) {
    SCOPED_TRACE(::testing::Message() << "engine " << k);
    GPIPE_EXPECT_THROW_WITH(engines[k]({8, 7}), c10::ValueError,
                            "module and sum of balance have different length (module: 16, sum of "
                            "balance: 15)");
    GPIPE_EXPECT_THROW_WITH(engines[k]({17, -1}), c10::ValueError,
                            "all balance numbers must be positive integer (balance: [17, -1])");
    GPIPE_EXPECT_THROW_WITH(engines[k]({8, 7}), c10::ValueError, "gpipe::balance::balance_by_time");
  }
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(name);
}

}  // namespace
}  // namespace split_test
}  // namespace gpipe

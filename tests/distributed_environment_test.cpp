// Tests of read_environment(): torchrun's variables, and a clear error for each bad one.
#include "test_util.h"

#include "gpipe/distributed/environment.h"

#include <cstdlib>
#include <map>
#include <string>

namespace gpipe {
namespace distributed {
namespace distributed_environment_test {
namespace {

constexpr const char* kVariables[] = {"RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE",
                                      "GROUP_RANK",
                                      "MASTER_ADDR",
                                      "MASTER_PORT",
                                      "TORCHELASTIC_USE_AGENT_STORE",
                                      "TORCHELASTIC_RUN_ID",
                                      "TORCHELASTIC_RESTART_COUNT"};

// Sets the variables for one test and restores the old values after it.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const std::map<std::string, std::string>& values) {
    for (const char* name : kVariables) {
      if (const char* old = std::getenv(name)) saved_[name] = old;
      unsetenv(name);
    }
    for (const auto& [name, value] : values) setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnvironment() {
    for (const char* name : kVariables) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

std::map<std::string, std::string> good() {
  return {{"RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

TEST(DistributedEnvironmentTest, ReadsTorchrunVariables) {
  ScopedEnvironment env(good());
  const Environment e = read_environment();
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.group_rank, 0);
  EXPECT_FALSE(e.agent_store);
  EXPECT_EQ(e.store_server(), "rank 0");
  EXPECT_EQ(e.run_id, "");
  EXPECT_EQ(e.restart_count, 0);
}

// What torchrun sets for the second rank of the second machine, 2 ranks per machine, after one
// restart.
TEST(DistributedEnvironmentTest, ReadsTorchrunAgentVariables) {
  auto values = good();
  values["RANK"] = "3";
  values["LOCAL_RANK"] = "1";
  values["LOCAL_WORLD_SIZE"] = "2";
  values["GROUP_RANK"] = "1";
  values["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  values["TORCHELASTIC_RUN_ID"] = "job7";
  values["TORCHELASTIC_RESTART_COUNT"] = "1";
  ScopedEnvironment env(values);
  const Environment e = read_environment();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.group_rank, 1);
  EXPECT_TRUE(e.agent_store);
  EXPECT_EQ(e.store_server(), "torchrun's agent");
  EXPECT_EQ(e.run_id, "job7");
  EXPECT_EQ(e.restart_count, 1);
}

TEST(DistributedEnvironmentTest, LocalRankDefaultsToRankOnItsMachine) {
  auto values = good();
  values.erase("LOCAL_RANK");
  values["RANK"] = "3";
  values["LOCAL_WORLD_SIZE"] = "2";
  ScopedEnvironment env(values);
  EXPECT_EQ(read_environment().local_rank, 1);
}

TEST(DistributedEnvironmentTest, LocalRankDefaultsToRank) {
  auto values = good();
  values.erase("LOCAL_RANK");
  ScopedEnvironment env(values);
  EXPECT_EQ(read_environment().local_rank, 1);
}

TEST(DistributedEnvironmentTest, MissingVariableIsNamed) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    auto values = good();
    values.erase(name);
    ScopedEnvironment env(values);
    GPIPE_EXPECT_THROW_WITH(read_environment(), c10::ValueError,
                            std::string("environment variable ") + name + " is not set");
  }
}

TEST(DistributedEnvironmentTest, BadValuesAreNamed) {
  const std::map<std::string, std::pair<std::string, std::string>> cases{
      {"RANK", {"4", "RANK must be in [0, WORLD_SIZE = 4), but is 4"}},
      {"WORLD_SIZE", {"0", "WORLD_SIZE must be at least 1, but is 0"}},
      {"LOCAL_RANK", {"-1", "LOCAL_RANK must be in [0, LOCAL_WORLD_SIZE = 4), but is -1"}},
      {"LOCAL_WORLD_SIZE", {"5", "LOCAL_WORLD_SIZE must be in [1, WORLD_SIZE = 4], but is 5"}},
      {"GROUP_RANK", {"-2", "GROUP_RANK must be at least 0, but is -2"}},
      {"TORCHELASTIC_USE_AGENT_STORE",
       {"yes", "TORCHELASTIC_USE_AGENT_STORE must be True or False, but is 'yes'"}},
      {"TORCHELASTIC_RESTART_COUNT",
       {"-1", "TORCHELASTIC_RESTART_COUNT must be at least 0, but is -1"}},
      {"MASTER_PORT", {"70000", "MASTER_PORT must be in [1, 65535], but is 70000"}},
      {"MASTER_ADDR", {"", "MASTER_ADDR is empty"}},
  };
  for (const auto& [name, value_and_message] : cases) {
    auto values = good();
    values[name] = value_and_message.first;
    ScopedEnvironment env(values);
    GPIPE_EXPECT_THROW_WITH(read_environment(), c10::ValueError, value_and_message.second);
  }
  auto values = good();
  values["WORLD_SIZE"] = "four";
  ScopedEnvironment env(values);
  GPIPE_EXPECT_THROW_WITH(read_environment(), c10::ValueError,
                          "WORLD_SIZE must be an integer, but is 'four'");
}

}  // namespace
}  // namespace distributed_environment_test
}  // namespace distributed
}  // namespace gpipe

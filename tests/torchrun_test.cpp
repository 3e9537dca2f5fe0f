// Tests of PipelineStage under torchrun, as users launch it: static rendezvous (torchrun's
// default), --standalone and the c10d rendezvous backend, on one machine and as two "machines"
// on loopback, and a group that torchrun restarts after a rank fails. Every run's losses and
// gradients equal, bitwise, those of the same workers under gpipe_launch; so does the model that
// `gpipe train` trains under torchrun. A rank of `gpipe train` killed mid-run under torchrun
// --max_restarts, or gpipe launch --max-restarts (LaunchRestartTest), is restarted and resumes
// from its snapshot. GPIPE_TORCHRUN (tests/CMakeLists.txt) is the torch wheel's torchrun for
// LibTorch 2.x, Debian's (python3-torch) for 1.13; without it the torchrun tests skip.
#include "test_util.h"

#include "distributed_launch.h"
#include "launcher.h"
#include "model_file.h"
#include "same_model.h"

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace gpipe {
namespace distributed {
namespace torchrun_test {
namespace {

// torchrun's flags are spelled as both 1.13 and 2.x read them (2.x reads --nproc-per-node too).
// GPIPE_TORCHRUN_FLAGS: what that torchrun needs besides (Debian's 1.13: --redirects 1 --tee 1).
const std::string kTorchrunFlags = GPIPE_TORCHRUN_FLAGS;

// The worker's arguments of every test: one step of 1F1B over 4 micro-batches.
const std::string kWorkerArgs = "--schedule 1f1b --chunks 4 --timeout-ms 60000";

using launcher::free_port;

struct Torchrun {
  std::vector<int> exit_codes;  // one per machine
  std::string output;           // every machine's torchrun output, in order
  std::string dir;              // where the ranks wrote their files
};

// Runs one torchrun per entry of `machines` (its own flags), all at once, each starting the
// worker with `worker_args` and --out.
Torchrun run_torchrun(const std::vector<std::string>& machines, const std::string& worker_args) {
  Torchrun run;
  run.dir = testing::make_temp_dir();
  run.exit_codes.assign(machines.size(), -1);
  std::vector<std::thread> threads;
  for (size_t m = 0; m < machines.size(); ++m) {
    threads.emplace_back([&run, &machines, &worker_args, m] {
      const std::string command = std::string(GPIPE_TORCHRUN) + " " + kTorchrunFlags + " " +
                                  machines[m] + " --no_python " + GPIPE_DISTRIBUTED_WORKER +
                                  " --out " + run.dir + " " + worker_args + " > " + run.dir +
                                  "/machine" + std::to_string(m) + ".log 2>&1";
      const int status = std::system(command.c_str());
      run.exit_codes[m] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t m = 0; m < machines.size(); ++m) {
    run.output += "--- machine " + std::to_string(m) + " (torchrun " + machines[m] + ")\n" +
                  testing::read_text(run.dir + "/machine" + std::to_string(m) + ".log");
  }
  return run;
}

at::Tensor load_tensor(const std::string& path) {
  at::Tensor tensor;
  torch::load(tensor, path);
  return tensor;
}

std::vector<at::Tensor> load_tensors(const std::string& path) {
  std::vector<at::Tensor> tensors;
  torch::load(tensors, path);
  return tensors;
}

// Both ranks succeeded, and every loss and gradient file of `actual` equals `expected`'s, bit
// for bit.
void expect_same_results(const std::string& actual, const std::string& expected) {
  for (int r = 0; r < 2; ++r) {
    const std::string rank = std::to_string(r);
    EXPECT_TRUE(testing::read_text(actual + "/ok_rank" + rank).size() > 0) << "rank " << r;
    EXPECT_TRUE(torch::equal(load_tensor(actual + "/loss_rank" + rank + ".pt"),
                             load_tensor(expected + "/loss_rank" + rank + ".pt")))
        << "rank " << r;
    const auto grads = load_tensors(actual + "/grads_stage" + rank + "_replica0.pt");
    const auto want = load_tensors(expected + "/grads_stage" + rank + "_replica0.pt");
    ASSERT_EQ(grads.size(), want.size()) << "stage " << r;
    for (size_t k = 0; k < grads.size(); ++k) {
      EXPECT_TRUE(torch::equal(grads[k], want[k])) << "stage " << r << ", parameter " << k;
    }
  }
}

// Runs the worker under torchrun on each machine's flags and under gpipe_launch, and compares.
// Returns the torchrun run's folder.
std::string expect_like_launcher(const std::vector<std::string>& machines,
                                 const std::string& worker_args = kWorkerArgs,
                                 const std::string& launcher_args = kWorkerArgs) {
  const testing::Launch launch = testing::launch_workers(2, launcher_args);
  EXPECT_EQ(launch.exit_code, 0) << launch.output;
  const Torchrun run = run_torchrun(machines, worker_args);
  for (size_t m = 0; m < machines.size(); ++m) {
    EXPECT_EQ(run.exit_codes[m], 0) << run.output;
  }
  if (!::testing::Test::HasFailure()) expect_same_results(run.dir, launch.dir);
  return run.dir;
}

std::string port_flag(const char* flag, int port) {
  return std::string(flag) + " " + std::to_string(port);
}

// torchrun sets OMP_NUM_THREADS=1 for its ranks, which an OpenBLAS (Debian's LibTorch) takes
// as its own process-wide thread count, changing results in the last bits. The runs compared with
// torchrun's (gpipe launch) get the same environment, as a user comparing them would set it.
class TorchrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(GPIPE_TORCHRUN).empty()) {
      GTEST_SKIP() << "no torchrun: scripts/setup.sh installs the torch wheel's (LibTorch 2.x) "
                      "and Debian's python3-torch (LibTorch 1.13)";
    }
    const char* threads = std::getenv("OMP_NUM_THREADS");
    saved_threads_ = threads ? std::optional<std::string>(threads) : std::nullopt;
    setenv("OMP_NUM_THREADS", "1", 1);
    set_threads_ = true;
  }

  void TearDown() override {
    if (!set_threads_) return;
    if (saved_threads_) {
      setenv("OMP_NUM_THREADS", saved_threads_->c_str(), 1);
    } else {
      unsetenv("OMP_NUM_THREADS");
    }
  }

 private:
  bool set_threads_ = false;
  std::optional<std::string> saved_threads_;
};

// Below the ports the kernel hands outgoing connections: none of the connections the ranks of
// other jobs open can take it before rank 0 listens (a port the kernel picked could be taken).
TEST(FreePortTest, IsBelowTheEphemeralRange) {
  for (int k = 0; k < 16; ++k) {
    const int port = free_port();
    EXPECT_GE(port, 1024);
    EXPECT_LT(port, launcher::ephemeral_ports().first);
  }
}

TEST_F(TorchrunTest, StaticRendezvous) {
  // torchrun's agent serves the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True).
  expect_like_launcher({"--nproc_per_node 2 " + port_flag("--master_port", free_port())});
}

TEST_F(TorchrunTest, Standalone) { expect_like_launcher({"--standalone --nproc_per_node 2"}); }

TEST_F(TorchrunTest, C10dRendezvous) {
  expect_like_launcher({"--nnodes 1 --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint " +
                        std::string("127.0.0.1:") + std::to_string(free_port())});
}

TEST_F(TorchrunTest, TwoMachinesStaticRendezvous) {
  const std::string port = std::to_string(free_port());
  std::vector<std::string> machines;
  for (int node = 0; node < 2; ++node) {
    machines.push_back("--nnodes 2 --node_rank " + std::to_string(node) +
                       " --master_addr 127.0.0.1 --master_port " + port + " --nproc_per_node 1");
  }
  expect_like_launcher(machines);
}

TEST_F(TorchrunTest, TwoMachinesC10dRendezvous) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  const std::string machine =
      "--nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_id gpipe --rdzv_endpoint " +
      endpoint;
  expect_like_launcher({machine, machine});
}

// Rank 1 fails in the first attempt (throws, or is killed); torchrun restarts the group, which
// meets again in the agent's store, where the first attempt's keys (its failure among them)
// must not count.
TEST_F(TorchrunTest, RestartedGroupKeepsAttemptsApart) {
  for (const std::string mode : {"throw", "kill"}) {
    SCOPED_TRACE(mode);
    const std::string fail = " --fail-rank 1 --fail-mode " + mode;
    const std::string dir = expect_like_launcher(
        {"--nproc_per_node 2 --max_restarts 1 " + port_flag("--master_port", free_port())},
        kWorkerArgs + fail + " --fail-attempts 1", kWorkerArgs + fail + " --fail-attempts 0");
    // The first attempt did fail (a killed rank leaves no word).
    if (mode == "throw") {
      EXPECT_NE(testing::read_text(dir + "/error_rank1").find("injected failure"),
                std::string::npos);
    }
  }
}

// `gpipe train` of a tiny model for `steps` steps on a text it writes into `dir`, quietly.
std::string tiny_train(const std::string& dir, int steps) {
  std::string text;
  for (int k = 0; k < 200; ++k) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(dir + "/corpus.txt") << text;
  return std::string(GPIPE_COMMAND) + " train --data " + dir +
         "/corpus.txt --layers 2 --embedding-dim 32 --heads 2 --block-size 16 --batch-size 16 "
         "--quiet --steps " +
         std::to_string(steps);
}

// `gpipe train` under torchrun trains what it trains under gpipe launch, bit for bit.
TEST_F(TorchrunTest, GpipeTrain) {
  const std::string dir = testing::make_temp_dir();
  const std::string train = tiny_train(dir, 3) + " --save " + dir;
  const std::string torchrun = std::string(GPIPE_TORCHRUN) + " " + kTorchrunFlags +
                               " --nproc_per_node 2 --master_port " + std::to_string(free_port()) +
                               " --no_python " + train + "/torchrun.pt > " + dir +
                               "/torchrun.log 2>&1";
  ASSERT_EQ(std::system(torchrun.c_str()), 0) << testing::read_text(dir + "/torchrun.log");
  const std::string launch = std::string(GPIPE_COMMAND) + " launch -n 2 -- " + train +
                             "/launch.pt > " + dir + "/launch.log 2>&1";
  ASSERT_EQ(std::system(launch.c_str()), 0) << testing::read_text(dir + "/launch.log");
  testing::expect_same_model(dir + "/torchrun.pt", dir + "/launch.pt");
}

// The process of a rank of `gpipe train` (not `gpipe launch`) whose command line names
// `marker`; -1 if none.
pid_t find_rank(const std::string& marker) {
  namespace fs = std::filesystem;
  const fs::path command = fs::canonical(GPIPE_COMMAND);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::error_code error;
    if (fs::read_symlink(entry.path() / "exe", error) != command || error) continue;
    const std::string cmdline = testing::read_text((entry.path() / "cmdline").string());
    const size_t first = cmdline.find('\0');  // the arguments are separated by NULs
    if (cmdline.compare(first + 1, 6, std::string("train\0", 6)) != 0) continue;
    if (cmdline.find(marker) == std::string::npos) continue;
    return static_cast<pid_t>(std::stol(entry.path().filename().string()));
  }
  return -1;
}

// The step of the last complete snapshot in `dir` (its "latest" names step-<S>), or 0.
int64_t latest_step(const std::string& dir) {
  const std::string latest = testing::read_text(dir + "/latest");
  const size_t at = latest.find("step-");
  return at == std::string::npos ? 0 : std::atoll(latest.c_str() + at + 5);
}

// Kills a rank of `gpipe train` at a random step (5 seeds) under `launcher()` (the command line
// before the program, with a restart allowed): the restarted ranks resume from the last complete
// snapshot and train, bit for bit, what a run that nobody interrupted trains.
void expect_resumes_after_a_kill(const std::function<std::string()>& launcher) {
  const std::string dir = testing::make_temp_dir();
  const std::string train = tiny_train(dir, 100);
  const std::string launch = std::string(GPIPE_COMMAND) + " launch -n 2 -- " + train + " --save " +
                             dir + "/expected.pt > " + dir + "/launch.log 2>&1";
  ASSERT_EQ(std::system(launch.c_str()), 0) << testing::read_text(dir + "/launch.log");
  for (unsigned seed = 0; seed < 5; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::string run = dir + "/run" + std::to_string(seed);
    const std::string command = launcher() + " " + train +
                                " --save-every 10 --resume --snapshot-dir " + run + " --save " +
                                run + ".pt > " + run + ".log 2>&1";
    int status = -1;
    std::thread job([&] { status = std::system(command.c_str()); });
    // Once the snapshot of step 10, 20, ... or 60 is complete (by seed), and a few random
    // milliseconds more: somewhere in the 10 steps that follow, with at least 40 steps to go.
    const int64_t target = 10 * (1 + seed % 6);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (latest_step(run) < target && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::mt19937 random(seed);
    std::this_thread::sleep_for(std::chrono::milliseconds(random() % 20));
    const pid_t rank = find_rank(run);
    const bool killed = rank > 0 && kill(rank, SIGKILL) == 0;
    job.join();
    EXPECT_TRUE(killed) << "no rank to kill: the run ended first";
    ASSERT_EQ(status, 0) << testing::read_text(run + ".log");
    testing::expect_same_model(run + ".pt", dir + "/expected.pt");
  }
}

TEST_F(TorchrunTest, KilledRankResumesFromTheLastSnapshot) {
  expect_resumes_after_a_kill([] {
    return std::string(GPIPE_TORCHRUN) + " " + kTorchrunFlags +
           " --max_restarts 1 --nproc_per_node 2 --master_port " + std::to_string(free_port()) +
           " --no_python";
  });
}

// The same under gpipe launch --max-restarts, which needs no torchrun.
TEST(LaunchRestartTest, KilledRankResumesFromTheLastSnapshot) {
  expect_resumes_after_a_kill(
      [] { return std::string(GPIPE_COMMAND) + " launch -n 2 --max-restarts 1 --grace 5 --"; });
}

}  // namespace
}  // namespace torchrun_test
}  // namespace distributed
}  // namespace gpipe

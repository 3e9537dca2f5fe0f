// Tests of a pipeline whose ranks run on separate hosts: two network namespaces that the test
// makes (ip netns), joined by a veth pair with private addresses that exist only inside them.
// Each rank binds to its host's interface (GLOO_SOCKET_IFNAME) and MASTER_ADDR is the first
// host's address, as on two machines. The results equal those on one host, bit for bit, and the
// ranks' clocks align over the link; a link cut mid-step makes every rank fail naming its
// unreachable peer within the timeout. The tests skip where namespaces cannot be made (they need
// root, or CAP_NET_ADMIN).
#include "test_util.h"

#include "distributed_launch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace gpipe {
namespace distributed {
namespace distributed_hosts_test {
namespace {

using ::testing::HasSubstr;

int shell(const std::string& command) {
  const int status = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Two hosts: namespaces "<name>-0" and "<name>-1", veth ends "<tag>0" and "<tag>1" with
// addresses 10.<a>.<b>.1 and .2 (/24), unique per test process; removed on destruction.
class TwoHosts {
 public:
  TwoHosts() {
    const int id = static_cast<int>(getpid());
    name_ = "gpipe-test-" + std::to_string(id);
    const std::string tag = "gp" + std::to_string(id % 100000) + "v";
    subnet_ = "10.213." + std::to_string(id % 250) + ".";
    for (int h = 0; h < 2; ++h) interfaces_.push_back(tag + std::to_string(h));
    const std::vector<std::string> steps = {
        "ip netns add " + host(0),
        "ip netns add " + host(1),
        "ip link add " + interfaces_[0] + " type veth peer name " + interfaces_[1],
        "ip link set " + interfaces_[0] + " netns " + host(0),
        "ip link set " + interfaces_[1] + " netns " + host(1),
    };
    for (const auto& step : steps) {
      if (shell(step) != 0) {
        failure_ = "cannot make two network namespaces (`" + step +
                   "` failed: it needs root or CAP_NET_ADMIN, and iproute2)";
        return;
      }
    }
    for (int h = 0; h < 2; ++h) {
      const std::string in = "ip -n " + host(h) + " ";
      for (const std::string& step :
           {in + "addr add " + address(h) + "/24 dev " + interfaces_[h],
            in + "link set " + interfaces_[h] + " up", in + "link set lo up"}) {
        if (shell(step) != 0) failure_ = "`" + step + "` failed";
      }
    }
  }
  ~TwoHosts() {
    for (int h = 0; h < 2; ++h) shell("ip netns del " + host(h));
  }

  const std::string& failure() const { return failure_; }
  std::string host(int h) const { return name_ + "-" + std::to_string(h); }
  std::string address(int h) const { return subnet_ + std::to_string(h + 1); }
  const std::string& interface(int h) const { return interfaces_[h]; }

  // Runs rank `h` of 2 of the worker on host h, MASTER_ADDR host 0's address.
  std::string rank_command(int h, int port, const std::string& dir, const std::string& args) const {
    return "ip netns exec " + host(h) + " env RANK=" + std::to_string(h) +
           " WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=" + std::to_string(h) +
           " MASTER_ADDR=" + address(0) + " MASTER_PORT=" + std::to_string(port) +
           " GLOO_SOCKET_IFNAME=" + interface(h) + " " + GPIPE_DISTRIBUTED_WORKER + " --out " +
           dir + " " + args + " > " + dir + "/host" + std::to_string(h) + ".log 2>&1";
  }

 private:
  std::string name_, subnet_, failure_;
  std::vector<std::string> interfaces_;
};

// Starts both ranks, runs `while_running` meanwhile, and returns their exit codes.
std::vector<int> run_on_hosts(const TwoHosts& hosts, const std::string& dir,
                              const std::string& args,
                              const std::function<void()>& while_running = {}) {
  std::vector<int> codes(2, -1);
  std::vector<std::thread> ranks;
  for (int h = 0; h < 2; ++h) {
    ranks.emplace_back([&, h] {
      const int status = std::system(hosts.rank_command(h, 29400, dir, args).c_str());
      codes[h] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    });
  }
  if (while_running) while_running();
  for (auto& rank : ranks) rank.join();
  return codes;
}

std::string logs(const std::string& dir) {
  return testing::read_text(dir + "/host0.log") + testing::read_text(dir + "/host1.log");
}

class DistributedHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!hosts_.failure().empty()) GTEST_SKIP() << hosts_.failure();
  }
  TwoHosts hosts_;
};

// Equal results; and the ranks' clocks, aligned over the link, agree within the uncertainty they
// state (the namespaces share this machine's steady clock, so the truth is known).
TEST_F(DistributedHostsTest, ResultsEqualOneHost) {
  const std::string args = "--schedule 1f1b --chunks 4 --timeout-ms 30000 --trace 1";
  const testing::Launch one_host = testing::launch_workers(2, args);
  ASSERT_EQ(one_host.exit_code, 0) << one_host.output;
  const std::string dir = testing::make_temp_dir();
  const auto codes = run_on_hosts(hosts_, dir, args);
  ASSERT_EQ(codes, (std::vector<int>{0, 0})) << logs(dir);
  std::vector<double> origin_us(2), uncertainty_us(2);
  for (int r = 0; r < 2; ++r) {
    std::istringstream clock(testing::read_text(dir + "/clock_rank" + std::to_string(r) + ".txt"));
    ASSERT_TRUE(clock >> origin_us[r] >> uncertainty_us[r]) << "rank " << r;
  }
  EXPECT_LE(std::abs(origin_us[1] - origin_us[0]), uncertainty_us[1] + 1)
      << "origins " << origin_us[0] << " and " << origin_us[1] << " us";
  for (int r = 0; r < 2; ++r) {
    const std::string rank = std::to_string(r);
    at::Tensor loss, expected;
    torch::load(loss, dir + "/loss_rank" + rank + ".pt");
    torch::load(expected, one_host.dir + "/loss_rank" + rank + ".pt");
    EXPECT_TRUE(torch::equal(loss, expected)) << "rank " << r;
    std::vector<at::Tensor> grads, want;
    torch::load(grads, dir + "/grads_stage" + rank + "_replica0.pt");
    torch::load(want, one_host.dir + "/grads_stage" + rank + "_replica0.pt");
    ASSERT_EQ(grads.size(), want.size());
    for (size_t k = 0; k < grads.size(); ++k) {
      EXPECT_TRUE(torch::equal(grads[k], want[k])) << "stage " << r << ", parameter " << k;
    }
  }
}

TEST_F(DistributedHostsTest, CutLinkIsNamedWithinTimeout) {
  // Steps without end until the link between the hosts goes down; with a 5 s timeout each rank
  // must then fail naming the other, not hang.
  const std::string dir = testing::make_temp_dir();
  const auto timeout = std::chrono::seconds(5);
  std::chrono::steady_clock::time_point cut;
  const auto codes = run_on_hosts(
      hosts_, dir, "--schedule 1f1b --chunks 4 --steps 100000000 --timeout-ms 5000", [&] {
        // Both ranks connected and stepping: two seconds after the later is connected.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        while ((testing::read_text(dir + "/connected_time_rank0").empty() ||
                testing::read_text(dir + "/connected_time_rank1").empty()) &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        std::this_thread::sleep_for(std::chrono::seconds(2));
        cut = std::chrono::steady_clock::now();
        shell("ip -n " + hosts_.host(0) + " link set " + hosts_.interface(0) + " down");
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  std::printf("both ranks ended %.2f s after the cut\n", seconds);
  EXPECT_EQ(codes, (std::vector<int>{1, 1})) << logs(dir);
  // Each names the other: rank 0 the one that stopped answering, rank 1 rank 0 (whose store it
  // lost).
  EXPECT_THAT(testing::read_text(dir + "/error_rank0"), HasSubstr("rank 1")) << logs(dir);
  EXPECT_THAT(testing::read_text(dir + "/error_rank1"), HasSubstr("rank 0")) << logs(dir);
  // Within the timeout and the failure protocol's margin (docs/distributed.md), on a busy
  // machine.
  EXPECT_LT(seconds, static_cast<double>(timeout.count()) + 5) << logs(dir);
}

}  // namespace
}  // namespace distributed_hosts_test
}  // namespace distributed
}  // namespace gpipe

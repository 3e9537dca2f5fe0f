// One message's cost through C10dTransport against a raw ProcessGroupGloo send/recv of the same
// tensor: 2 processes on this machine bounce a float tensor back and forth, over sizes from
// 256 B to 64 MiB. Rank 0 times the round trips.
//
//   raw        ProcessGroupGloo::send / recv of the tensor; each side posts its next receive,
//              into a new tensor as a pipeline's stage needs one per micro-batch, before it
//              sends (the best a caller of Gloo can do).
//   transport  C10dTransport::send of the tensor as stage 0's activation and recv of it as
//              stage 1's, the same back as its gradient, in steps of 32 round trips as
//              PipelineStage runs them: begin_step(), the step's receives announced with
//              expect(), flush() at its end. Each message carries the transport's header.
//
// Each round times both, in turn (the first alternating), for every size; a round of a size is
// `count` round trips (fewer for large sizes). Prints per size the median round trip of each over
// the rounds and the transport's time over raw's with its min / median / max over rounds.
//
// Usage: ping_pong [--rounds N] [--json FILE]
#include "common/bench_util.h"

#include "gpipe/distributed/c10d_transport.h"
#include "gpipe/distributed/rendezvous.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace gpipe::bench;
namespace gd = gpipe::distributed;
using Clock = std::chrono::steady_clock;

const std::vector<int64_t> kSizes = {256, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
constexpr int kRawTag = 1 << 20;  // apart from the transport's tags

// Round trips per round for messages of `bytes`: about 256 MiB moved, at least 10.
int64_t round_trips(int64_t bytes) { return std::clamp<int64_t>((256LL << 20) / bytes, 10, 2000); }

void wait(const c10::intrusive_ptr<c10d::Work>& work) { work->wait(); }

// `n` round trips over raw Gloo; rank 0 returns the seconds.
double raw(gd::Backend& gloo, int64_t rank, at::Tensor x, int64_t n) {
  std::vector<at::Tensor> out{x};
  const int peer = static_cast<int>(1 - rank);
  const auto start = Clock::now();
  if (rank == 0) {
    for (int64_t k = 0; k < n; ++k) {
      std::vector<at::Tensor> in{at::empty_like(x)};
      auto recv = gloo.recv(in, peer, kRawTag);
      wait(gloo.send(out, peer, kRawTag));
      wait(recv);
    }
  } else {
    std::vector<at::Tensor> in{at::empty_like(x)};
    auto recv = gloo.recv(in, peer, kRawTag);
    for (int64_t k = 0; k < n; ++k) {
      wait(recv);
      std::vector<at::Tensor> got = in;
      if (k + 1 < n) {
        in = {at::empty_like(x)};
        recv = gloo.recv(in, peer, kRawTag);
      }
      wait(gloo.send(got, peer, kRawTag));  // sends back what it received
    }
  }
  return seconds_since(start);
}

// `n` round trips through the transport, in steps of 32; rank 0 returns the seconds.
double transport(gd::C10dTransport& t, int64_t rank, const at::Tensor& x, int64_t n) {
  const auto start = Clock::now();
  for (int64_t done = 0; done < n; done += 32) {
    const int64_t m = std::min<int64_t>(32, n - done);
    t.begin_step();
    if (rank == 0) {
      t.expect(1, 0, m);
      for (int64_t k = 0; k < m; ++k) {
        t.send(gpipe::Batch(x), 0, 1, k);
        t.recv(1, 0, k);
      }
    } else {
      t.expect(0, 1, m);
      for (int64_t k = 0; k < m; ++k) t.send(t.recv(0, 1, k), 1, 0, k);
    }
    t.flush();
  }
  return seconds_since(start);
}

int run_rank(int rounds, const std::string& out) {
  gpipe::memory::reuse_freed_cpu_memory();  // as a training process does (gpipe/cpu_malloc.h)
  at::set_num_threads(1);
  const auto group = gd::rendezvous(gd::read_environment(), std::chrono::seconds(120));
  const int64_t rank = group.rank();
  gd::C10dTransport t(group, 2);
  std::ofstream report;
  if (rank == 0) report.open(out);
  for (const int64_t bytes : kSizes) {
    const at::Tensor x = at::ones({bytes / 4});
    const int64_t n = round_trips(bytes);
    raw(*group.group, rank, x, 2);  // warm up: connections, buffers
    transport(t, rank, x, 2);
    for (int round = 0; round < rounds; ++round) {
      double r = 0, p = 0;
      if (round % 2 == 0) {
        r = raw(*group.group, rank, x, n);
        p = transport(t, rank, x, n);
      } else {
        p = transport(t, rank, x, n);
        r = raw(*group.group, rank, x, n);
      }
      if (rank == 0) report << bytes << " " << r / n << " " << p / n << "\n";
    }
  }
  t.barrier("ping_pong done", std::chrono::seconds(60));
  return 0;
}

std::string size_name(int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1 << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--rank-output") {
    return run_rank(std::atoi(argv[3]), argv[2]);
  }
  const Args args = parse_args(
      argc, argv, "ping_pong",
      "A tensor bounced between 2 processes: C10dTransport against raw ProcessGroupGloo "
      "send/recv, per size from 256 B to 64 MiB.",
      7);
  char dir[] = "/tmp/gpipe_ping_pong_XXXXXX";
  const std::string out = std::string(mkdtemp(dir)) + "/rank0";
  if (!run_ranks_of_this_program(
          2, {argv[0], "--rank-output", out, std::to_string(args.rounds)})) {
    std::fprintf(stderr, "ping_pong: a rank failed\n");
    return 1;
  }
  std::map<int64_t, std::vector<double>> raw_times, transport_times, ratios;
  std::ifstream in(out);
  int64_t bytes = 0;
  double r = 0, p = 0;
  while (in >> bytes >> r >> p) {
    raw_times[bytes].push_back(r);
    transport_times[bytes].push_back(p);
    ratios[bytes].push_back(p / r);
  }
  std::printf("round trip of one tensor between 2 processes (Gloo, loopback), %d rounds\n",
              args.rounds);
  std::printf("%-8s %12s %16s %26s\n", "size", "raw (us)", "transport (us)",
              "transport / raw min/med/max");
  nlohmann::json rows = nlohmann::json::array();
  for (const int64_t size : kSizes) {
    auto& q = ratios[size];
    if (q.empty()) continue;
    const double lo = *std::min_element(q.begin(), q.end());
    const double hi = *std::max_element(q.begin(), q.end());
    const double raw_us = 1e6 * median(raw_times[size]);
    const double transport_us = 1e6 * median(transport_times[size]);
    std::printf("%-8s %12.1f %16.1f %10.3f %7.3f %7.3f\n", size_name(size).c_str(), raw_us,
                transport_us, lo, median(q), hi);
    rows.push_back({{"bytes", size},
                    {"raw_us", raw_us},
                    {"transport_us", transport_us},
                    {"ratio_min", lo},
                    {"ratio_median", median(q)},
                    {"ratio_max", hi}});
  }
  write_json(args, {{"rounds", args.rounds}, {"sizes", rows}});
  return 0;
}

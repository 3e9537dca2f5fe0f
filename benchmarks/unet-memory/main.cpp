// U-Net memory: peak CPU memory of one training step (forward + backward) of a U-Net pipelined
// with its skips as portals, vs the same model passing the skip tensors through every partition
// as extra outputs (torchgpipe's "tuplified" skips), for each checkpoint mode, measured side by
// side in one run with the tracking allocator. Also prints the medians of the step times.
//
// Default: U-Net (depth 4, 2 convs, base 16), batch 16 x 3 x 64 x 64, 4 even partitions, 4
// chunks. --paper: the U-Net (24, 160) of the reference's unet-memory pipeline-4 experiment
// (depth 5, 7.8B parameters), balance [472, 54, 36, 515], 32 chunks, batch 32 x 3 x 192 x 192.
#include "common/bench_util.h"

#include "models/unet.h"

#include "gpipe/balance/balance.h"
#include "gpipe/memory.h"
#include "gpipe/pipe.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace bench = gpipe::bench;

struct Contender {
  std::string name;
  bool carrying;
  gpipe::GPipe model{nullptr};
  std::vector<double> peaks_mib;
  std::vector<double> times_ms;
};

// One training step; returns its peak CPU memory above what was allocated before it, in bytes.
int64_t step(Contender& contender, const torch::Tensor& input) {
  const int64_t before = gpipe::memory::cpu_current_bytes();
  gpipe::memory::reset_cpu_peak();
  torch::Tensor output = contender.carrying ? contender.model->forward<std::vector<torch::Tensor>>(
                                                  std::vector<torch::Tensor>{input})[0]
                                            : contender.model->forward(input);
  output.mean().backward();
  output = torch::Tensor();
  const int64_t peak = gpipe::memory::cpu_peak_bytes() - before;
  contender.model->zero_grad();
  return peak;
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = bench::parse_args(
      argc, argv, "unet-memory",
      "U-Net peak memory of a training step, skips as portals vs carried through every\n"
      "partition, for each checkpoint mode. Default: U-Net (depth 4, 2 convs, base 16), batch\n"
      "16 x 3 x 64 x 64, 4 partitions, 4 chunks. --paper: U-Net (24, 160) of the reference's\n"
      "pipeline-4 row, balance [472, 54, 36, 515], 32 chunks, batch 32 x 3 x 192 x 192.",
      5);
  const int rounds = args.rounds;
  const auto options = gpipe::models::UNetOptions()
                           .depth(args.paper ? 5 : 4)
                           .num_convs(args.paper ? 24 : 2)
                           .base_channels(args.paper ? 160 : 16)
                           .dropout(0.1);
  const int64_t image = args.paper ? 192 : 64;
  const int64_t batch = args.paper ? 32 : 16;
  const int64_t partitions = 4;
  const int64_t chunks = args.paper ? 32 : 4;
  torch::set_num_threads(1);
  gpipe::memory::install_tracking_cpu_allocator();

  torch::manual_seed(0);
  const auto input = torch::rand({batch, options.input_channels(), image, image});
  // The paper's model is too big to build just to count its 1077 layers.
  const auto balance =
      args.paper ? std::vector<int64_t>{472, 54, 36, 515}
                 : gpipe::balance::balance_by_count(
                       partitions, static_cast<int64_t>(gpipe::models::unet(options)->size()));
  const int64_t layers = std::accumulate(balance.begin(), balance.end(), int64_t{0});

  std::printf(
      "U-Net(depth %lld, convs %lld, base %lld): %lld layers; input %lldx%lldx%lldx%lld; "
      "balance %s, %lld chunks, 1 thread, %d rounds\n\n",
      static_cast<long long>(options.depth()), static_cast<long long>(options.num_convs()),
      static_cast<long long>(options.base_channels()), static_cast<long long>(layers),
      static_cast<long long>(batch), static_cast<long long>(options.input_channels()),
      static_cast<long long>(image), static_cast<long long>(image), bench::list(balance).c_str(),
      static_cast<long long>(chunks), rounds);
  std::printf("%-12s %-9s %14s %14s %10s %14s %14s\n", "checkpoint", "", "portals MiB",
              "carrying MiB", "ratio", "portals ms", "carrying ms");

  nlohmann::json rows = nlohmann::json::array();
  for (const auto mode : {gpipe::CheckpointMode::kNever, gpipe::CheckpointMode::kExceptLast,
                          gpipe::CheckpointMode::kAlways}) {
    std::vector<Contender> contenders;
    for (const bool carrying : {false, true}) {
      torch::manual_seed(1);  // the same weights for both
      auto sequential =
          carrying ? gpipe::models::unet_carrying_skips(options) : gpipe::models::unet(options);
      Contender contender{carrying ? "carrying" : "portals", carrying};
      contender.model =
          gpipe::GPipe(sequential, gpipe::GPipeOptions(balance).chunks(chunks).checkpoint(mode));
      step(contender, input);  // warm-up
      contenders.push_back(std::move(contender));
    }
    // Round by round, alternating who goes first, so drift hits both alike.
    for (int round = 0; round < rounds; ++round) {
      for (size_t k = 0; k < contenders.size(); ++k) {
        auto& contender = contenders[(k + static_cast<size_t>(round)) % contenders.size()];
        const auto tick = std::chrono::steady_clock::now();
        const int64_t peak = step(contender, input);
        const auto tock = std::chrono::steady_clock::now();
        contender.peaks_mib.push_back(bench::mib(static_cast<double>(peak)));
        contender.times_ms.push_back(
            std::chrono::duration<double, std::milli>(tock - tick).count());
      }
    }
    const double portals = bench::median(contenders[0].peaks_mib);
    const double carrying = bench::median(contenders[1].peaks_mib);
    std::ostringstream name;
    name << mode;
    std::printf("%-12s %-9s %14.2f %14.2f %9.3fx %14.1f %14.1f\n", name.str().c_str(), "peak",
                portals, carrying, carrying / portals, bench::median(contenders[0].times_ms),
                bench::median(contenders[1].times_ms));
    rows.push_back({{"checkpoint", name.str()},
                    {"portals_peak_mib", portals},
                    {"carrying_peak_mib", carrying},
                    {"carrying_over_portals", carrying / portals},
                    {"portals_step_ms", bench::median(contenders[0].times_ms)},
                    {"carrying_step_ms", bench::median(contenders[1].times_ms)}});
  }
  std::printf(
      "\nratio = carrying / portals peak memory (medians): above 1 means portals use less.\n");
  bench::write_json(args, {{"benchmark", "unet-memory"},
                           {"config",
                            {{"depth", options.depth()},
                             {"num_convs", options.num_convs()},
                             {"base_channels", options.base_channels()},
                             {"layers", layers},
                             {"batch", batch},
                             {"image", image},
                             {"balance", balance},
                             {"chunks", chunks},
                             {"paper_sizes", args.paper},
                             {"rounds", rounds},
                             {"intra_op_threads", torch::get_num_threads()}}},
                           {"results", rows}});
  return 0;
}

// U-Net memory: peak CPU memory of one training step (forward + backward) of a U-Net pipelined
// with its skips as portals, vs the same model passing the skip tensors through every partition
// as extra outputs (torchgpipe's "tuplified" skips), for each checkpoint mode, measured side by
// side in one run with the tracking allocator. Also prints the medians of the step times.
//
// Usage: unet_memory [rounds=5] [depth=4] [base_channels=16] [image=64] [batch=16]
//                    [partitions=4] [chunks=4]
#include "models/unet.h"

#include "gpipe/memory.h"
#include "gpipe/pipe.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// `layers` layers cut into `partitions` runs of nearly equal length.
std::vector<int64_t> even_balance(int64_t layers, int64_t partitions) {
  std::vector<int64_t> balance(static_cast<size_t>(partitions), layers / partitions);
  for (int64_t k = 0; k < layers % partitions; ++k) ++balance[static_cast<size_t>(k)];
  return balance;
}

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
  auto arg = [&](int k, long long fallback) { return argc > k ? std::atoll(argv[k]) : fallback; };
  const int rounds = static_cast<int>(arg(1, 5));
  const auto options = gpipe::models::UNetOptions()
                           .depth(arg(2, 4))
                           .num_convs(2)
                           .base_channels(arg(3, 16))
                           .dropout(0.1);
  const int64_t image = arg(4, 64);
  const int64_t batch = arg(5, 16);
  const int64_t partitions = arg(6, 4);
  const int64_t chunks = arg(7, 4);
  torch::set_num_threads(1);
  gpipe::memory::install_tracking_cpu_allocator();

  torch::manual_seed(0);
  const auto input = torch::rand({batch, options.input_channels(), image, image});
  const int64_t layers = static_cast<int64_t>(gpipe::models::unet(options)->size());
  const auto balance = even_balance(layers, partitions);

  std::printf(
      "U-Net(depth %lld, convs %lld, base %lld): %lld layers; input %lldx%lldx%lldx%lld; "
      "%lld partitions, %lld chunks, 1 thread, %d rounds\n\n",
      static_cast<long long>(options.depth()), static_cast<long long>(options.num_convs()),
      static_cast<long long>(options.base_channels()), static_cast<long long>(layers),
      static_cast<long long>(batch), static_cast<long long>(options.input_channels()),
      static_cast<long long>(image), static_cast<long long>(image),
      static_cast<long long>(partitions), static_cast<long long>(chunks), rounds);
  std::printf("%-12s %-9s %14s %14s %10s %14s %14s\n", "checkpoint", "", "portals MiB",
              "carrying MiB", "ratio", "portals ms", "carrying ms");

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
        contender.peaks_mib.push_back(mib(peak));
        contender.times_ms.push_back(
            std::chrono::duration<double, std::milli>(tock - tick).count());
      }
    }
    const double portals = median(contenders[0].peaks_mib);
    const double carrying = median(contenders[1].peaks_mib);
    std::ostringstream name;
    name << mode;
    std::printf("%-12s %-9s %14.2f %14.2f %9.3fx %14.1f %14.1f\n", name.str().c_str(), "peak",
                portals, carrying, carrying / portals, median(contenders[0].times_ms),
                median(contenders[1].times_ms));
  }
  std::printf(
      "\nratio = carrying / portals peak memory (medians): above 1 means portals use less.\n");
  return 0;
}

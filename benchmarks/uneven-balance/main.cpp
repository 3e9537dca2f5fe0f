// Uneven layers: the slowest pipeline stage's forward+backward time under balance_by_time's
// balance vs a uniform split, medians measured side by side (interleaved rounds) in one run.
//
// Usage: uneven_balance [rounds=15] [partitions=4]
// Keeps freed memory for reuse (gpipe/cpu_malloc.h) for stable CPU timings.
#include "gpipe/balance/balance.h"
#include "gpipe/cpu_malloc.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int64_t kWidth = 128;
constexpr int64_t kBatch = 64;
// Hidden width of each layer's MLP block: the cost of a layer grows with it.
const std::vector<int64_t> kHidden = {4096, 2048, 2048, 512, 256, 256,
                                      256,  256,  256,  256, 128, 128};

// Linear(width, hidden) + ReLU + Linear(hidden, width): one layer of the model.
struct BlockImpl : torch::nn::Cloneable<BlockImpl> {
  explicit BlockImpl(int64_t hidden) : hidden(hidden) { reset(); }
  void reset() override {
    up = register_module("up", torch::nn::Linear(kWidth, hidden));
    down = register_module("down", torch::nn::Linear(hidden, kWidth));
  }
  torch::Tensor forward(const torch::Tensor& x) { return down(torch::relu(up(x))); }
  int64_t hidden;
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(Block);

torch::nn::Sequential make_model() {
  torch::nn::Sequential model;
  for (const int64_t hidden : kHidden) model->push_back(Block(hidden));
  return model;
}

std::string format(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t k = 0; k < values.size(); ++k) out += (k ? "," : "") + std::to_string(values[k]);
  return out + "]";
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The partitions of `model` by `balance`, each a Sequential of consecutive layers.
std::vector<torch::nn::Sequential> split(torch::nn::Sequential& model,
                                         const std::vector<int64_t>& balance) {
  std::vector<torch::nn::Sequential> stages;
  auto layer = model->begin();
  for (const int64_t size : balance) {
    torch::nn::Sequential stage;
    for (int64_t k = 0; k < size; ++k) stage->push_back(*layer++);
    stages.push_back(stage);
  }
  return stages;
}

// Forward+backward time of every stage on its own input, in milliseconds.
std::vector<double> time_stages(std::vector<torch::nn::Sequential>& stages,
                                const torch::Tensor& input) {
  std::vector<double> times;
  torch::Tensor x = input;
  for (auto& stage : stages) {
    x = x.detach().requires_grad_();
    const auto tick = std::chrono::steady_clock::now();
    torch::Tensor y = stage->forward(x);
    y.backward(torch::ones_like(y));
    const auto tock = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(tock - tick).count());
    x = y;
  }
  for (auto& stage : stages) stage->zero_grad();
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  gpipe::memory::reuse_freed_cpu_memory();
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  const int64_t partitions = argc > 2 ? std::atoll(argv[2]) : 4;
  torch::set_num_threads(1);
  torch::manual_seed(0);

  auto model = make_model();
  const auto sample = torch::randn({kBatch, kWidth});
  const int64_t layers = static_cast<int64_t>(model->size());

  const auto begun = std::chrono::steady_clock::now();
  const auto costs = gpipe::balance::profile_times(model, sample);
  const auto by_time = gpipe::balance::block_partition(costs, partitions);
  const double profiling_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();

  std::vector<int64_t> uniform(static_cast<size_t>(partitions), layers / partitions);
  for (int64_t k = 0; k < layers % partitions; ++k) ++uniform[static_cast<size_t>(k)];

  std::printf(
      "model: %lld layers Linear(%lld,h)+ReLU+Linear(h,%lld), h = %s, batch %lld, "
      "1 thread\n",
      static_cast<long long>(layers), static_cast<long long>(kWidth),
      static_cast<long long>(kWidth), format(kHidden).c_str(), static_cast<long long>(kBatch));
  std::printf("profiled layer costs (us): ");
  for (const int64_t cost : costs) std::printf("%lld ", static_cast<long long>(cost / 1000));
  std::printf("\nprofiling took %.2f s\n\n", profiling_s);

  struct Config {
    std::string name;
    std::vector<int64_t> balance;
    std::vector<torch::nn::Sequential> stages;
    std::vector<std::vector<double>> samples;  // [stage][round]
  };
  std::vector<Config> configs = {{"uniform", uniform, {}, {}},
                                 {"balance_by_time", by_time, {}, {}}};
  for (auto& config : configs) {
    config.stages = split(model, config.balance);
    config.samples.resize(config.balance.size());
    time_stages(config.stages, sample);  // warm-up
  }
  for (int round = 0; round < rounds; ++round) {
    for (auto& config : configs) {
      const auto times = time_stages(config.stages, sample);
      for (size_t j = 0; j < times.size(); ++j) config.samples[j].push_back(times[j]);
    }
  }

  std::printf("%-16s %-26s %-40s %s\n", "split", "balance", "stage fwd+bwd medians (ms)",
              "slowest (ms)");
  std::vector<double> slowest;
  for (auto& config : configs) {
    std::string stages;
    double worst = 0;
    for (auto& samples : config.samples) {
      const double m = median(samples);
      worst = std::max(worst, m);
      char buffer[32];
      std::snprintf(buffer, sizeof(buffer), "%.2f ", m);
      stages += buffer;
    }
    slowest.push_back(worst);
    std::printf("%-16s %-26s %-40s %.2f\n", config.name.c_str(), format(config.balance).c_str(),
                stages.c_str(), worst);
  }
  std::printf("\nslowest stage: uniform / balance_by_time = %.2fx (%d rounds, medians)\n",
              slowest[0] / slowest[1], rounds);
  return 0;
}

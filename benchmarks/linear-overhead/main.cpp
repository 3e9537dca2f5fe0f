// What the pipeline costs on top of the work itself, measured side by side with a plain loop.
//
// 1. Scheduling overhead per task (micro-batch x partition): 8 x (Linear(8,8)+ReLU), batch 64,
//    chunks 64, balance [2,2,2,2] on CPU, against a plain loop over the same 64 micro-batches;
//    torchgpipe on this machine: 179 us (never) and 300 us (always) forward+backward.
// 2. Fixed cost of one call: the same model at chunks 1 against one plain call (torchgpipe:
//    1.67 ms forward+backward).
// 3. Heavy layers: 8 x Linear(1024,1024), batch 256, chunks {1,4,8,32}, GPipe(never) against the
//    plain loop over the same micro-batches (goal: within 3%).
//
// Each measurement alternates the contenders round by round and reports medians.
//
//   linear_overhead [--rounds N] [--json FILE]
#include <gpipe/gpipe.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Runs each contender once per round, in turn, and returns the median seconds of each. Each round
// starts with the next contender, so none always runs first (or right after the same one).
std::vector<double> race(const std::vector<std::function<void()>>& contenders, int rounds) {
  for (const auto& run : contenders) run();  // warm-up
  std::vector<std::vector<double>> seconds(contenders.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t turn = 0; turn < contenders.size(); ++turn) {
      const size_t c = (round + turn) % contenders.size();
      const auto start = Clock::now();
      contenders[c]();
      seconds[c].push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  std::vector<double> medians;
  for (auto& s : seconds) medians.push_back(median(s));
  return medians;
}

// Linear(8,8)+ReLU as one layer, like the reference's nn.Sequential blocks (LibTorch's
// Sequential cannot nest).
struct LinearReLUImpl : torch::nn::Module {
  LinearReLUImpl() : linear(register_module("linear", torch::nn::Linear(8, 8))) {}
  torch::Tensor forward(torch::Tensor x) { return torch::relu(linear(x)); }
  torch::nn::Linear linear;
};
TORCH_MODULE(LinearReLU);

torch::nn::Sequential small_model() {
  torch::nn::Sequential model;
  for (int k = 0; k < 8; ++k) model->push_back(LinearReLU());
  return model;
}

torch::nn::Sequential heavy_model() {
  torch::nn::Sequential model;
  for (int k = 0; k < 8; ++k) model->push_back(torch::nn::Linear(1024, 1024));
  return model;
}

// The baseline: the same Sequential over the same micro-batches, one after another.
torch::Tensor plain_loop(torch::nn::Sequential& model, const torch::Tensor& input, int64_t chunks) {
  std::vector<torch::Tensor> outputs;
  for (const auto& chunk : input.chunk(chunks)) outputs.push_back(model->forward(chunk));
  return outputs.size() == 1 ? outputs[0] : torch::cat(outputs);
}

void step(const torch::Tensor& output, bool backward) {
  if (backward) output.sum().backward();
}

struct Row {
  std::string name;
  double value;
  std::string unit;
  std::string note;
};

}  // namespace

int main(int argc, char** argv) {
  gpipe::memory::reuse_freed_cpu_memory();  // stable timings
  int rounds = 41;
  std::string json_path;
  for (int k = 1; k + 1 < argc; k += 2) {
    const std::string flag = argv[k];
    if (flag == "--rounds") {
      rounds = std::stoi(argv[k + 1]);
    } else if (flag == "--json") {
      json_path = argv[k + 1];
    } else {
      std::cerr << "linear_overhead: unknown flag " << flag << "\n";
      return 2;
    }
  }
  at::set_num_threads(1);
  torch::manual_seed(0);
  std::vector<Row> rows;

  // 1 and 2: scheduling overhead and fixed cost, small model.
  {
    auto model = small_model();
    const auto input = torch::randn({64, 8});
    const int64_t chunks = 64, partitions = 4;
    gpipe::GPipe never(
        model,
        gpipe::GPipeOptions({2, 2, 2, 2}).chunks(chunks).checkpoint(gpipe::CheckpointMode::kNever));
    gpipe::GPipe always(model, gpipe::GPipeOptions({2, 2, 2, 2})
                                   .chunks(chunks)
                                   .checkpoint(gpipe::CheckpointMode::kAlways));
    gpipe::GPipe single(model, gpipe::GPipeOptions({2, 2, 2, 2}).chunks(1));
    const double tasks = chunks * partitions;
    for (const bool backward : {true, false}) {
      // Separate races: a contender's leftovers (freed graphs, allocator state) must not land
      // on the next one, which for the sub-millisecond calls of the fixed cost dominated.
      auto t = race({[&] { step(plain_loop(model, input, chunks), backward); },
                     [&] { step(never->forward(input), backward); },
                     [&] { step(always->forward(input), backward); }},
                    rounds);
      const auto one = race({[&] { step(plain_loop(model, input, 1), backward); },
                             [&] { step(single->forward(input), backward); }},
                            rounds * 4);
      t.insert(t.end(), one.begin(), one.end());
      const std::string pass = backward ? "forward+backward" : "forward";
      rows.push_back({"plain loop, 64 micro-batches, " + pass, t[0] * 1e3, "ms", ""});
      rows.push_back({"GPipe never, chunks 64, " + pass, t[1] * 1e3, "ms", ""});
      rows.push_back({"GPipe always, chunks 64, " + pass, t[2] * 1e3, "ms", ""});
      rows.push_back({"plain, one call, " + pass, t[3] * 1e3, "ms", ""});
      rows.push_back({"GPipe chunks 1, " + pass, t[4] * 1e3, "ms", ""});
      rows.push_back({"overhead per task, never, " + pass, (t[1] - t[0]) / tasks * 1e6, "us",
                      "reference 179 us fwd+bwd, 132 us fwd; goal <= 15 us"});
      rows.push_back({"overhead per task, always, " + pass, (t[2] - t[0]) / tasks * 1e6, "us",
                      "reference 300 us fwd+bwd, 173 us fwd; goal <= 30 us"});
      rows.push_back({"fixed cost per call (chunks 1), " + pass, (t[4] - t[3]) * 1e3, "ms",
                      "reference 1.67 ms fwd+bwd; goal <= 0.15 ms"});
      model->zero_grad();
    }
  }

  // 3: heavy layers, GPipe(never) against the plain loop at the same chunks.
  {
    auto model = heavy_model();
    const auto input = torch::randn({256, 1024});
    for (const int64_t chunks : {1, 4, 8, 32}) {
      gpipe::GPipe pipe(model, gpipe::GPipeOptions({2, 2, 2, 2})
                                   .chunks(chunks)
                                   .checkpoint(gpipe::CheckpointMode::kNever));
      const auto t = race({[&] { step(plain_loop(model, input, chunks), true); },
                           [&] { step(pipe->forward(input), true); }},
                          std::max(6, rounds / 2));
      rows.push_back({"8 x Linear(1024) chunks " + std::to_string(chunks) + ": GPipe / plain",
                      t[1] / t[0], "x",
                      "plain " + std::to_string(t[0] * 1e3).substr(0, 6) + " ms; goal <= 1.03"});
      model->zero_grad();
    }
  }

  std::printf("%-52s %10s  %s\n", "measurement (median)", "value", "note");
  for (const auto& row : rows) {
    std::printf("%-52s %7.3f %-2s  %s\n", row.name.c_str(), row.value, row.unit.c_str(),
                row.note.c_str());
  }
  if (!json_path.empty()) {
    std::ofstream json(json_path);
    json << "[\n";
    for (size_t k = 0; k < rows.size(); ++k) {
      json << "  {\"name\": \"" << rows[k].name << "\", \"value\": " << rows[k].value
           << ", \"unit\": \"" << rows[k].unit << "\"}" << (k + 1 < rows.size() ? "," : "") << "\n";
    }
    json << "]\n";
  }
}

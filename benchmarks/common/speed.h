// Training throughput of contenders measured side by side: the plain model ("naive-1") and
// GPipe pipelines of several partition and micro-batch counts, each training on its own copy of
// the same model; one step of each per round, in turn, the first one rotating, so that drift on a
// shared machine hits all alike. Reports the median samples/s and the peak memory of a step.
//
// Partitions go to CUDA devices 0..k-1 when LibTorch has that many; otherwise every partition is
// on the CPU, where GPipe computes them one after another on the calling thread: there is no
// parallelism to win, so a CPU run measures what micro-batching, checkpointing and scheduling cost.
// Peak memory is the tracking CPU allocator's (gpipe/memory.h): on CUDA it sees host memory only.
#pragma once

#include "common/bench_util.h"

#include "gpipe/memory.h"
#include "gpipe/pipe.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace gpipe {
namespace bench {

/// Builds the model (the same weights for every contender: the caller seeds).
using ModelFactory = std::function<torch::nn::Sequential()>;
/// A batch of `batch` inputs on `input_device` and its targets on `output_device`.
using DataFactory = std::function<std::pair<torch::Tensor, torch::Tensor>(
    int64_t batch, c10::Device input_device, c10::Device output_device)>;
using LossFunction = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

struct Contender {
  std::string name;
  int64_t batch = 1;
  /// Layers per partition; empty for the plain model without GPipe.
  std::vector<int64_t> balance;
  /// Micro-batches; for the plain model, > 1 runs them one after another in a loop.
  int64_t chunks = 1;
  CheckpointMode checkpoint = CheckpointMode::kExceptLast;
  /// Another model than the benchmark's (e.g. one carrying its skips); null for the default.
  ModelFactory make_model;
  /// The model takes and returns std::vector<Tensor>, the first input/output being the data.
  bool list_io = false;
  /// Wall seconds of each measured step and their peak memory above what was held before.
  std::vector<double> seconds;
  std::vector<double> peak_mib;

  double samples_per_second() const { return static_cast<double>(batch) / median(seconds); }
  bool pipelined() const { return !balance.empty(); }
};

/// Device of each of `partitions` partitions: CUDA 0..k-1 if there are so many, else the CPU.
inline std::vector<c10::Device> pipeline_devices(size_t partitions) {
  std::vector<c10::Device> devices;
  const bool cuda = torch::cuda::device_count() >= std::max<size_t>(partitions, 1);
  for (const auto j : c10::irange(std::max<size_t>(partitions, 1))) {
    devices.emplace_back(cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(j))
                              : c10::Device(c10::kCPU));
  }
  return devices;
}

inline void synchronize() {
  if (torch::cuda::is_available()) torch::cuda::synchronize();
}

/// Runs one warm-up step and then `rounds` measured steps of every contender.
inline void run_side_by_side(std::vector<Contender>& contenders, const ModelFactory& make_model,
                             const DataFactory& make_data, const LossFunction& loss_function,
                             int rounds) {
  memory::install_tracking_cpu_allocator();
  std::vector<std::function<void()>> steps;  // one training step of each contender
  for (auto& contender : contenders) {
    torch::manual_seed(0);
    torch::nn::Sequential sequential = contender.make_model ? contender.make_model() : make_model();
    const auto devices = pipeline_devices(contender.balance.size());
    std::shared_ptr<torch::nn::Module> module;
    std::function<torch::Tensor(const torch::Tensor&)> forward;
    const bool list_io = contender.list_io;
    auto call = [list_io](auto& model, const torch::Tensor& x) -> torch::Tensor {
      if (!list_io) return model->forward(x);
      return model->template forward<std::vector<torch::Tensor>>(std::vector<torch::Tensor>{x})[0];
    };
    if (contender.pipelined()) {
      GPipe pipe(sequential, GPipeOptions(contender.balance)
                                 .devices(devices)
                                 .chunks(contender.chunks)
                                 .checkpoint(contender.checkpoint));
      module = pipe.ptr();
      forward = [pipe, call](const torch::Tensor& x) mutable { return call(pipe, x); };
    } else {
      sequential->to(devices[0]);
      module = sequential.ptr();
      // With chunks > 1: the same micro-batches in a plain loop, to tell what splitting the
      // batch costs from what the pipeline adds.
      const int64_t chunks = contender.chunks;
      forward = [sequential, call, chunks](const torch::Tensor& x) mutable {
        if (chunks == 1) return call(sequential, x);
        std::vector<torch::Tensor> outputs;
        for (const auto& part : x.chunk(chunks)) outputs.push_back(call(sequential, part));
        return torch::cat(outputs);
      };
    }
    auto optimizer =
        std::make_shared<torch::optim::SGD>(module->parameters(), torch::optim::SGDOptions(0.1));
    auto data = make_data(contender.batch, devices.front(), devices.back());
    Contender* self = &contender;
    steps.push_back([=] {
      PeakMeter meter(devices);
      meter.start();
      const auto start = std::chrono::steady_clock::now();
      torch::Tensor loss = loss_function(forward(data.first), data.second);
      loss.backward();
      optimizer->step();
      optimizer->zero_grad();
      synchronize();
      self->seconds.push_back(seconds_since(start));
      self->peak_mib.push_back(mib(static_cast<double>(meter.peak())));
    });
  }
  for (auto& step : steps) step();  // warm-up
  for (auto& contender : contenders) contender.seconds.clear(), contender.peak_mib.clear();
  for (const auto round : c10::irange(rounds)) {
    for (const auto k : c10::irange(steps.size())) {
      steps[(k + static_cast<size_t>(round)) % steps.size()]();
    }
  }
}

inline std::string describe(CheckpointMode mode) {
  std::ostringstream out;
  out << mode;
  return out.str();
}

/// The results as JSON rows; speedups against contenders[baseline].
inline nlohmann::json results_json(const std::vector<Contender>& contenders, size_t baseline = 0) {
  nlohmann::json rows = nlohmann::json::array();
  const double base = contenders[baseline].samples_per_second();
  for (const auto& contender : contenders) {
    nlohmann::json row{{"name", contender.name},
                       {"batch", contender.batch},
                       {"pipelined", contender.pipelined()},
                       {"chunks", contender.chunks},
                       {"samples_per_second", contender.samples_per_second()},
                       {"speedup", contender.samples_per_second() / base},
                       {"step_seconds", contender.seconds},
                       {"peak_mib", median(contender.peak_mib)}};
    if (contender.pipelined()) {
      row["balance"] = contender.balance;
      row["checkpoint"] = describe(contender.checkpoint);
    }
    rows.push_back(row);
  }
  return rows;
}

/// Prints one row per contender: its setup, median samples/s, speedup over
/// contenders[baseline] and median peak memory of a step.
inline void print_results(const std::vector<Contender>& contenders, size_t baseline = 0) {
  Table table({"experiment", "batch", "balance", "chunks", "checkpoint", "samples/s", "speedup",
               "peak MiB"});
  const double base = contenders[baseline].samples_per_second();
  for (const auto& c : contenders) {
    table.add({c.name, std::to_string(c.batch), c.pipelined() ? list(c.balance) : "-",
               c.pipelined() || c.chunks > 1 ? std::to_string(c.chunks) : "-",
               c.pipelined() ? describe(c.checkpoint) : "-", fixed(c.samples_per_second(), 2),
               times(c.samples_per_second() / base), fixed(median(c.peak_mib), 1)});
  }
  table.print();
}

/// The common configuration: threads, LibTorch, where the partitions ran.
inline nlohmann::json environment_json(const Args& args) {
  return {{"paper_sizes", args.paper},
          {"rounds", args.rounds},
          {"intra_op_threads", torch::get_num_threads()},
          {"cuda_devices", torch::cuda::device_count()},
          {"partitions_on", torch::cuda::is_available() ? "cuda (if enough devices)" : "cpu"}};
}

/// A batch of `image` x `image` RGB images and their labels among `classes` (ResNet, AmoebaNet).
inline DataFactory images_with_classes(int64_t image, int64_t classes) {
  return [=](int64_t batch, c10::Device input_device, c10::Device output_device) {
    return std::make_pair(
        torch::rand({batch, 3, image, image}, input_device),
        torch::randint(classes, {batch}, torch::TensorOptions(output_device).dtype(torch::kLong)));
  };
}

/// A batch of `image` x `image` RGB images and their one-channel masks (U-Net).
inline DataFactory images_with_masks(int64_t image) {
  return [=](int64_t batch, c10::Device input_device, c10::Device output_device) {
    return std::make_pair(torch::rand({batch, 3, image, image}, input_device),
                          torch::ones({batch, 1, image, image}, output_device));
  };
}

inline torch::Tensor cross_entropy(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(output, target);
}

inline torch::Tensor binary_cross_entropy(const torch::Tensor& output,
                                          const torch::Tensor& target) {
  return torch::nn::functional::binary_cross_entropy_with_logits(output, target);
}

/// One speed benchmark: what it trains, who competes, and what is printed around the table.
struct SpeedSuite {
  /// The header's first line, e.g. "U-Net (depth 5, 5 convs, base 8), 241 layers, 64 x 64 images".
  std::string title;
  ModelFactory make_model;
  DataFactory make_data;
  LossFunction loss;
  std::vector<Contender> contenders;
  /// The most partitions a contender has, for the header's line on where they run.
  size_t partitions = 8;
  /// Printed after the table: what the speedups are over and the reference's numbers.
  std::string notes;
  /// The JSON report's config (the environment is added).
  nlohmann::json config;
};

/// Runs `suite` as every speed benchmark does: a header, `args.rounds` side-by-side rounds,
/// the table, the notes, and the JSON report `name`.json. Returns main's exit code.
inline int run_speed_suite(const Args& args, const std::string& name, SpeedSuite& suite) {
  torch::set_num_threads(1);
  std::printf("%s; SGD;\n%d rounds, 1 intra-op thread, partitions on %s\n\n", suite.title.c_str(),
              args.rounds,
              pipeline_devices(suite.partitions)[0].is_cuda() ? "CUDA devices" : "the CPU");
  run_side_by_side(suite.contenders, suite.make_model, suite.make_data, suite.loss, args.rounds);
  print_results(suite.contenders);
  std::printf("\n%s", suite.notes.c_str());
  nlohmann::json config = suite.config;
  config["environment"] = environment_json(args);
  write_json(
      args, {{"benchmark", name}, {"config", config}, {"results", results_json(suite.contenders)}});
  return 0;
}

}  // namespace bench
}  // namespace gpipe

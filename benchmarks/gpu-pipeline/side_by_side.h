// One model side by side: gpipe's contenders here, torchgpipe's in the Python peer
// (torchgpipe_side.py), with the same weights, input, target, balances, chunks and checkpoint
// mode; the rounds, the loss check and the report of gpu_pipeline's part 2.
#pragma once

#include "common/bench_util.h"
#include "gpu-pipeline/profiled_step.h"
#include "gpu-pipeline/python_peer.h"

#include <gpipe/gpipe.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <limits>

namespace gpipe {
namespace bench {

/// A model of the side-by-side runs: built here by `build`, and by twin_models.py's function
/// `twin` with the keyword arguments `options` there.
struct ModelCase {
  std::string name;
  std::string twin;
  nlohmann::json options;
  std::function<torch::nn::Sequential()> build;
  std::vector<int64_t> input;   ///< the batch's shape
  std::vector<int64_t> target;  ///< a float target's shape (MSE loss); empty: class labels
  int64_t classes = 0;          ///< labels in [0, classes) (cross-entropy loss)
};

struct Measurement {
  double milliseconds = 0;
  double peak_mib = 0;
};

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

/// One step's time and its peak memory above what `device` held before it.
inline Measurement time_step(const std::function<void()>& step, const c10::Device& device) {
  PeakMeter meter({device});
  meter.start();
  const auto start = std::chrono::steady_clock::now();
  step();
  synchronize(device);
  return {1000 * seconds_since(start), mib(static_cast<double>(meter.peak()))};
}

/// Cross entropy against class labels, MSE against a float target; torchgpipe_side.py's loss().
inline torch::Tensor loss_of(const torch::Tensor& output, const torch::Tensor& target) {
  const torch::Tensor on_output = target.to(output.device());
  if (target.scalar_type() == torch::kLong) {
    return torch::nn::functional::cross_entropy(output, on_output);
  }
  return torch::nn::functional::mse_loss(output, on_output);
}

/// One training step of `forward` on (input, target), SGD with learning rate 0.01.
inline std::function<void()> training_step(Forward forward, std::vector<torch::Tensor> parameters,
                                           torch::Tensor input, torch::Tensor target) {
  auto optimizer = std::make_shared<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.01));
  return [=] {
    optimizer->zero_grad();
    loss_of(forward(input), target).backward();
    optimizer->step();
  };
}

class SideBySide {
 public:
  /// Builds the plain model and the pipelines of 2, 4 and 8 partitions on `device`, each from
  /// the same seed, and their forward losses; with a peer, has it build the same from this
  /// side's weights, input and target.
  SideBySide(const ModelCase& model, const c10::Device& device, PythonPeer* peer)
      : model_(model), device_(device), peer_(peer) {
    torch::manual_seed(1);
    input_ = torch::randn(model.input);
    target_ = model.target.empty() ? torch::randint(model.classes, {model.input[0]}, torch::kLong)
                                   : torch::randn(model.target);
    const torch::Tensor input = input_.to(device), target = target_.to(device);
    std::string state;  // the weights the peer loads: the plain model's before its first step
    for (const int64_t partitions : {0, 2, 4, 8}) {
      Contender contender;
      contender.name = partitions ? "pipeline-" + std::to_string(partitions) : "plain";
      torch::manual_seed(0);
      torch::nn::Sequential sequential = model.build();
      std::shared_ptr<torch::nn::Module> module = sequential.ptr();
      if (partitions == 0) {
        if (peer) state = save_state(*sequential);
        sequential->to(device);
        contender.forward = [sequential](const torch::Tensor& x) mutable {
          return sequential->forward(x);
        };
      } else {
        contender.balance =
            balance::balance_by_count(partitions, static_cast<int64_t>(sequential->size()));
        GPipe pipe(sequential, GPipeOptions(contender.balance)
                                   .devices(std::vector<c10::Device>(partitions, device))
                                   .chunks(kChunks)
                                   .checkpoint(CheckpointMode::kExceptLast));
        module = pipe.ptr();
        contender.forward = [pipe](const torch::Tensor& x) mutable { return pipe->forward(x); };
      }
      contender.loss = loss_of(contender.forward(input), target).item<double>();
      contender.step = training_step(contender.forward, module->parameters(), input, target);
      contenders_.push_back(std::move(contender));
    }
    contenders_.push_back(arithmetic(input, target));
    if (peer_) {
      nlohmann::json setup{{"op", "setup"},
                           {"model", model.twin},
                           {"options", model.options},
                           {"state", state},
                           {"device", device.str()},
                           {"threads", at::get_num_threads()}};
      for (const auto& contender : contenders_) {
        if (!contender.on_peer) continue;
        setup["contenders"].push_back({{"name", contender.name},
                                       {"balance", contender.balance},
                                       {"chunks", kChunks},
                                       {"checkpoint", "except_last"}});
      }
      const nlohmann::json reply = peer_->request(setup);
      unlink(state.c_str());
      for (auto& contender : contenders_) {
        if (contender.on_peer) {
          contender.peer_loss = reply.at("losses").at(contender.name).get<double>();
        }
      }
    }
  }

  /// One warm-up step of every contender on each side, then `rounds` rounds; each round steps
  /// every contender once on each side, gpipe first in even rounds and torchgpipe in odd ones.
  void measure(int rounds) {
    for (int round = -1; round < rounds; ++round) {
      for (auto& contender : contenders_) {
        const bool gpipe_first = round % 2 == 0;
        for (const bool gpipe : {gpipe_first, !gpipe_first}) {
          if (gpipe) {
            const Measurement m = time_step(contender.step, device_);
            if (round >= 0) contender.gpipe.push_back(m);
          } else if (peer_ && contender.on_peer) {
            const nlohmann::json m =
                peer_->request({{"op", "step"}, {"contender", contender.name}});
            if (round >= 0) {
              contender.torchgpipe.push_back(
                  {m.at("ms").get<double>(),
                   m.at("peak_mib").is_null() ? kNotMeasured : m.at("peak_mib").get<double>()});
            }
          }
        }
      }
    }
  }

  /// Profiles one step of the plain model, pipeline-8 and the arithmetic on each side that runs
  /// it, into `dir`/<twin>.<contender>.<side>.json (Chrome traces; trace_summary.py reads them).
  void trace(const std::string& dir) {
    for (auto& contender : contenders_) {
      if (contender.name != "plain" && contender.name != "pipeline-8" &&
          contender.name != "arithmetic") {
        continue;
      }
      const std::string prefix = dir + "/" + model_.twin + "." + contender.name;
      profile_step(contender.step, device_, prefix + ".gpipe.json");
      if (peer_ && contender.on_peer) {
        peer_->request(
            {{"op", "trace"}, {"contender", contender.name}, {"path", prefix + ".torchgpipe.json"}});
      }
    }
  }

  /// Whether each contender's forward loss before training is the same on both sides (true
  /// without a peer): within 1e-5 of it on the CPU, 1e-3 on CUDA (whose kernels may reorder
  /// sums between processes).
  bool same_losses() const {
    const double tolerance = device_.is_cuda() ? 1e-3 : 1e-5;
    for (const auto& contender : contenders_) {
      if (!peer_ || !contender.on_peer) continue;
      const double difference = std::abs(contender.loss - contender.peer_loss);
      if (!(difference <= tolerance * std::max(1.0, std::abs(contender.loss)))) return false;
    }
    return true;
  }

  /// Prints the model's table and returns its report: per contender each side's step times and
  /// peak memory, the ratios to each side's plain model and gpipe over torchgpipe per round.
  nlohmann::json report() const {
    std::printf("\n%s, batch %lld, chunks %lld, checkpoint except_last, every partition on %s\n",
                model_.name.c_str(), static_cast<long long>(model_.input[0]),
                static_cast<long long>(kChunks), device_.str().c_str());
    Table table({"contender", "gpipe ms", "torchgpipe ms", "gpipe/plain", "gpipe/arithmetic",
                 "torchgpipe/plain",
                 "gpipe/torchgpipe (min med max)", "gpipe MiB", "torchgpipe MiB"});
    nlohmann::json report{{"model", model_.name},
                          {"twin", model_.twin},
                          {"options", model_.options},
                          {"input", model_.input},
                          {"chunks", kChunks},
                          {"same_losses", same_losses()}};
    const Contender& plain = contenders_.front();
    const Summary arithmetic = summarize(contenders_.back().gpipe);
    for (const auto& contender : contenders_) {
      const Summary gpipe = summarize(contender.gpipe), torchgpipe = summarize(contender.torchgpipe);
      const Summary gpipe_plain = summarize(plain.gpipe),
                    torchgpipe_plain = summarize(plain.torchgpipe);
      std::vector<double> ratios;  // paired within each round
      for (size_t r = 0; r < contender.torchgpipe.size(); ++r) {
        ratios.push_back(contender.gpipe[r].milliseconds / contender.torchgpipe[r].milliseconds);
      }
      const auto spread = [](std::vector<double> values) -> nlohmann::json {
        if (values.empty()) return nullptr;
        std::sort(values.begin(), values.end());
        return {{"min", values.front()}, {"median", median(values)}, {"max", values.back()}};
      };
      const nlohmann::json over_torchgpipe = spread(ratios);
      const auto cell = [](double value, int digits) {
        return std::isnan(value) ? std::string("-") : fixed(value, digits);
      };
      table.add({contender.name, cell(gpipe.ms, 1), cell(torchgpipe.ms, 1),
                 cell(gpipe.ms / gpipe_plain.ms, 3), cell(gpipe.ms / arithmetic.ms, 3),
                 cell(torchgpipe.ms / torchgpipe_plain.ms, 3),
                 over_torchgpipe.is_null() ? "-"
                                           : fixed(over_torchgpipe["min"].get<double>(), 3) + " " +
                                                 fixed(over_torchgpipe["median"].get<double>(), 3) +
                                                 " " + fixed(over_torchgpipe["max"].get<double>(), 3),
                 cell(gpipe.peak_mib, 1), cell(torchgpipe.peak_mib, 1)});
      nlohmann::json row{{"contender", contender.name},
                         {"balance", contender.balance},
                         {"gpipe", side_report(contender.gpipe, contender.loss)},
                         {"gpipe_over_plain", gpipe.ms / gpipe_plain.ms},
                         {"gpipe_over_arithmetic", gpipe.ms / arithmetic.ms},
                         {"gpipe_over_torchgpipe", over_torchgpipe}};
      if (peer_ && contender.on_peer) {
        row["torchgpipe"] = side_report(contender.torchgpipe, contender.peer_loss);
        row["torchgpipe_over_plain"] = torchgpipe.ms / torchgpipe_plain.ms;
      }
      report["contenders"].push_back(row);
    }
    table.print();
    std::printf("arithmetic: the plain model over the %lld micro-batches one after another, each "
                "but the last\n  twice forward (as checkpointing recomputes): what a pipeline "
                "on one device computes\n",
                static_cast<long long>(kChunks));
    if (peer_) {
      double worst = 0;
      for (const auto& c : contenders_) {
        if (c.on_peer) worst = std::max(worst, std::abs(c.loss - c.peer_loss));
      }
      std::printf("forward losses before training, gpipe against torchgpipe: %s (largest "
                  "difference %.3g)\n",
                  same_losses() ? "the same" : "DIFFERENT", worst);
    }
    return report;
  }

 private:
  static constexpr int64_t kChunks = 8;
  static constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

  struct Contender {
    std::string name;
    std::vector<int64_t> balance;  // empty: the plain model
    Forward forward;
    std::function<void()> step;
    bool on_peer = true;  // torchgpipe runs it too
    double loss = 0, peer_loss = kNotMeasured;  // the forward loss before any step
    std::vector<Measurement> gpipe, torchgpipe;
  };
  struct Summary {
    double ms = kNotMeasured, peak_mib = kNotMeasured;
  };

  static Summary summarize(const std::vector<Measurement>& measurements) {
    if (measurements.empty()) return {};
    std::vector<double> ms, peaks;
    for (const auto& m : measurements) ms.push_back(m.milliseconds), peaks.push_back(m.peak_mib);
    return {median(ms), median(peaks)};
  }

  // What a pipeline on one device computes, without the pipeline: the plain model (its own copy)
  // over the micro-batches one after another, each forward and backward, all but the last
  // forwarded once more before (checkpointing's recomputation); the gradients of the batch's
  // loss, as the pipelines compute.
  Contender arithmetic(const torch::Tensor& input, const torch::Tensor& target) const {
    torch::manual_seed(0);
    torch::nn::Sequential sequential = model_.build();
    sequential->to(device_);
    auto optimizer = std::make_shared<torch::optim::SGD>(sequential->parameters(),
                                                         torch::optim::SGDOptions(0.01));
    Contender contender;
    contender.name = "arithmetic";
    contender.on_peer = false;
    contender.loss = kNotMeasured;
    contender.step = [sequential, optimizer, input, target]() mutable {
      optimizer->zero_grad();
      const auto inputs = input.chunk(kChunks), targets = target.chunk(kChunks);
      for (size_t m = 0; m < inputs.size(); ++m) {
        if (m + 1 < inputs.size()) {
          torch::NoGradGuard no_grad;
          sequential->forward(inputs[m]);
        }
        const double share = static_cast<double>(inputs[m].size(0)) / input.size(0);
        (loss_of(sequential->forward(inputs[m]), targets[m]) * share).backward();
      }
      optimizer->step();
    };
    return contender;
  }

  // One side's measurements of one contender (a NaN, not measured, is written as null).
  static nlohmann::json side_report(const std::vector<Measurement>& measurements, double loss) {
    nlohmann::json ms = nlohmann::json::array(), peaks = nlohmann::json::array();
    for (const auto& m : measurements) ms.push_back(m.milliseconds), peaks.push_back(m.peak_mib);
    const Summary summary = summarize(measurements);
    return {{"ms", ms},
            {"median_ms", summary.ms},
            {"peak_mib", peaks},
            {"median_peak_mib", summary.peak_mib},
            {"forward_loss", loss}};
  }

  // The model's weights (parameters and buffers, as named here, each prefixed "model."), the
  // input and the target, in a file that torch.load reads (torch::pickle_save's format).
  std::string save_state(const torch::nn::Module& model) const {
    c10::Dict<std::string, at::Tensor> state;
    for (const auto& item : model.named_parameters()) {
      state.insert("model." + item.key(), item.value().detach());
    }
    for (const auto& item : model.named_buffers()) {
      state.insert("model." + item.key(), item.value());
    }
    state.insert("input", input_);
    state.insert("target", target_);
    const std::vector<char> bytes = torch::pickle_save(c10::IValue(state));
    char path[] = "/tmp/gpu_pipeline_state.XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0 || write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) {
      throw std::runtime_error(std::string("cannot write the state file ") + path);
    }
    close(fd);
    return path;
  }

  ModelCase model_;
  c10::Device device_;
  PythonPeer* peer_;
  torch::Tensor input_, target_;
  std::vector<Contender> contenders_;
};

}  // namespace bench
}  // namespace gpipe

// AmoebaNet-D memory: parameters, model memory and peak activation memory of training ever
// larger AmoebaNet-D (L, D) models with ever more partitions (torchgpipe's
// benchmarks/amoebanetd-memory, the GPipe paper's Table 1), measured by the tracking CPU
// allocator; next to each pipeline, the same model trained plain (no GPipe) on the same batch.
//
// As in the reference: two training steps with RMSprop; model memory is 3 x the parameters
// (weights, gradients, RMSprop's square averages); peak activation memory is the peak above
// that and the batch. torchgpipe sums the peaks of its GPUs; here every partition is on the CPU,
// so the numbers are totals, and the plain model's column is what GPipe saves: micro-batches,
// with all but the last checkpointed, keep far fewer activations. By default D is 1/8 of the
// reference's and the batch 32 x 64 x 64 (the reference: 128 x 224 x 224, micro-batches of 1).
#include "common/bench_util.h"

#include "models/amoebanet.h"

#include "gpipe/memory.h"
#include "gpipe/pipe.h"

#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

namespace bench = gpipe::bench;

struct Experiment {
  std::string name;
  int64_t L, D;
  std::vector<int64_t> balance;  // empty: the plain model only
};

struct Measurement {
  int64_t parameters = 0;
  double model_bytes = 0;       // 3 x parameters
  double activation_bytes = 0;  // median peak above model memory and data
};

// Two training steps; the peak above the parameters, their gradients and RMSprop's state.
double activation_peak(torch::nn::Module& model,
                       const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                       const torch::Tensor& input, const torch::Tensor& target,
                       double parameter_bytes) {
  torch::optim::RMSprop optimizer(model.parameters());
  const int64_t before = gpipe::memory::cpu_current_bytes();
  gpipe::memory::reset_cpu_peak();
  for (int step = 0; step < 2; ++step) {
    auto loss = torch::nn::functional::cross_entropy(forward(input), target);
    loss.backward();
    optimizer.step();
  }
  return static_cast<double>(gpipe::memory::cpu_peak_bytes() - before) - 2 * parameter_bytes;
}

Measurement measure(const Experiment& experiment, bool pipelined, int64_t batch, int64_t image,
                    int64_t chunks, int rounds) {
  std::vector<double> peaks;
  Measurement result;
  for (int round = 0; round < rounds; ++round) {
    torch::manual_seed(0);
    torch::nn::Sequential model = gpipe::models::amoebanetd(
        gpipe::models::AmoebaNetOptions().num_layers(experiment.L).num_filters(experiment.D));
    result.parameters = 0;
    for (const auto& parameter : model->parameters()) result.parameters += parameter.numel();
    const double parameter_bytes = static_cast<double>(result.parameters) * 4;
    result.model_bytes = 3 * parameter_bytes;
    const auto input = torch::rand({batch, 3, image, image});
    const auto target = torch::randint(1000, {batch}, torch::kLong);
    if (pipelined) {
      gpipe::GPipe pipe(model, gpipe::GPipeOptions(experiment.balance).chunks(chunks));
      peaks.push_back(activation_peak(
          *pipe, [&](const torch::Tensor& x) { return pipe->forward(x); }, input, target,
          parameter_bytes));
    } else {
      peaks.push_back(activation_peak(
          *model, [&](const torch::Tensor& x) { return model->forward(x); }, input, target,
          parameter_bytes));
    }
  }
  result.activation_bytes = bench::median(peaks);
  return result;
}

std::string gib_or_mib(double bytes, bool paper) {
  return paper ? bench::fixed(bytes / (1 << 30), 2) + " GiB"
               : bench::fixed(bench::mib(bytes), 1) + " MiB";
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = bench::parse_args(
      argc, argv, "amoebanetd-memory",
      "AmoebaNet-D (L, D) memory: parameters, model memory and peak activation memory of\n"
      "training, GPipe with 1, 2, 4, 8 partitions vs the plain model, on the CPU's tracking\n"
      "allocator. Default: D / 8 of the reference's, batch 32 x 3 x 64 x 64, 32 chunks.\n"
      "--paper: the reference's (L, D), batch 128 x 3 x 224 x 224, 128 chunks (hundreds of GiB).",
      1);
  torch::set_num_threads(1);
  gpipe::memory::install_tracking_cpu_allocator();
  const int64_t scale = args.paper ? 1 : 8;
  const int64_t batch = args.paper ? 128 : 32;
  const int64_t image = args.paper ? 224 : 64;
  const int64_t chunks = args.paper ? 128 : 32;
  const std::vector<Experiment> experiments = {
      {"baseline", 18, 208 / scale, {}},
      {"pipeline-1", 18, 416 / scale, {24}},
      {"pipeline-2", 18, 544 / scale, {16, 8}},
      {"pipeline-4", 36, 544 / scale, {16, 12, 7, 7}},
      {"pipeline-8", 72, 512 / scale, {23, 16, 11, 6, 6, 5, 5, 6}},
  };
  std::printf(
      "AmoebaNet-D (L, D), batch %lld x 3 x %lld x %lld, %lld chunks (checkpoint "
      "except_last); RMSprop, 2 steps; %d round(s), 1 intra-op thread, all on the CPU\n\n",
      static_cast<long long>(batch), static_cast<long long>(image), static_cast<long long>(image),
      static_cast<long long>(chunks), args.rounds);
  bench::Table table({"experiment", "(L, D)", "balance", "parameters", "model memory",
                      "peak activation", "plain: peak activation", "plain / pipeline"});
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& experiment : experiments) {
    const bool pipelined = !experiment.balance.empty();
    const Measurement plain = measure(experiment, false, batch, image, chunks, args.rounds);
    Measurement pipe = plain;
    if (pipelined) pipe = measure(experiment, true, batch, image, chunks, args.rounds);
    const std::string size =
        "(" + std::to_string(experiment.L) + ", " + std::to_string(experiment.D) + ")";
    table.add({experiment.name, size, pipelined ? bench::list(experiment.balance) : "-",
               bench::fixed(static_cast<double>(pipe.parameters) / 1e6, 2) + "M",
               gib_or_mib(pipe.model_bytes, args.paper),
               pipelined ? gib_or_mib(pipe.activation_bytes, args.paper) : "-",
               gib_or_mib(plain.activation_bytes, args.paper),
               pipelined ? bench::times(plain.activation_bytes / pipe.activation_bytes) : "-"});
    nlohmann::json row{{"name", experiment.name},
                       {"num_layers", experiment.L},
                       {"num_filters", experiment.D},
                       {"parameters", pipe.parameters},
                       {"model_memory_bytes", pipe.model_bytes},
                       {"plain_peak_activation_bytes", plain.activation_bytes}};
    if (pipelined) {
      row["balance"] = experiment.balance;
      row["peak_activation_bytes"] = pipe.activation_bytes;
    }
    rows.push_back(row);
  }
  table.print();
  std::printf(
      "\ntorchgpipe on 8 Tesla P40s (paper sizes): parameters 81.5M / 319.0M / 542.7M / 1.06B /\n"
      "1.84B; peak activation: baseline out of memory (at batch 128), then 0.91 / 3.39 / 6.91 /\n"
      "10.83 GiB. GPipe lets the model grow with the partitions because each device holds its\n"
      "share of the parameters and, checkpointing, only the partition boundaries of every\n"
      "micro-batch; the last column is that saving on one CPU.\n");
  bench::write_json(args, {{"benchmark", "amoebanetd-memory"},
                           {"config",
                            {{"batch", batch},
                             {"image", image},
                             {"chunks", chunks},
                             {"checkpoint", "except_last"},
                             {"paper_sizes", args.paper},
                             {"rounds", args.rounds},
                             {"intra_op_threads", torch::get_num_threads()}}},
                           {"results", rows}});
  return 0;
}

// gpu_pipeline: the GPU check's benchmark (scripts/gpu-check.sh), on one device: cuda:0, or the
// CPU at a small size where there is no GPU (so that CI runs it).
//
// 1. GPipe's overhead: a plain Sequential against GPipe over the same model in one partition, at
//    chunks 1, 4 and 8 (no checkpointing); the ratio is GPipe's step time over the plain one's.
// 2. A ResNet-101 pipeline of k partitions, all on the one device (each partition with its own
//    streams, so Copy/Wait and record_stream run), chunks 8, checkpoint except_last, against the
//    plain model: step time and peak memory (the caching allocator's on CUDA, the tracking
//    allocator's on the CPU).
#include "common/bench_util.h"
#include "models/resnet.h"

#include <gpipe/gpipe.h>
#include <torch/torch.h>

#include <functional>

namespace {

using gpipe::bench::fixed;
using gpipe::bench::median;
using gpipe::bench::mib;
using gpipe::bench::seconds_since;

struct Result {
  double milliseconds = 0;
  double peak_mib = 0;
};

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The median step time and peak memory above what was allocated before, over `rounds` steps
// after one warm-up step.
Result measure(const std::function<void()>& step, const c10::Device& device, int rounds) {
  step();
  synchronize(device);
  std::vector<double> times, peaks;
  gpipe::bench::PeakMeter meter({device});
  for (int round = 0; round < rounds; ++round) {
    meter.start();
    const auto start = std::chrono::steady_clock::now();
    step();
    synchronize(device);
    times.push_back(1000 * seconds_since(start));
    peaks.push_back(mib(static_cast<double>(meter.peak())));
  }
  return {median(times), median(peaks)};
}

// One training step of `forward` on (input, target) with SGD over `parameters`.
std::function<void()> training_step(std::function<torch::Tensor(const torch::Tensor&)> forward,
                                    std::vector<torch::Tensor> parameters, torch::Tensor input,
                                    torch::Tensor target) {
  auto optimizer = std::make_shared<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.01));
  return [=] {
    optimizer->zero_grad();
    torch::Tensor output = forward(input);
    torch::nn::functional::cross_entropy(output, target.to(output.device())).backward();
    optimizer->step();
  };
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = gpipe::bench::parse_args(
      argc, argv, "gpu_pipeline",
      "GPipe's overhead over the plain model (chunks 1, 4, 8) and a ResNet-101 pipeline of k\n"
      "partitions on one device (cuda:0; the CPU at a small size without a GPU).",
      /*default_rounds=*/5);
  const bool cuda = torch::cuda::is_available();
  const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (!cuda) gpipe::memory::install_tracking_cpu_allocator();
  torch::manual_seed(0);
  nlohmann::json report{{"device", device.str()}, {"rounds", args.rounds}};
  std::printf("gpu_pipeline on %s (%s sizes), median of %d steps\n\n", device.str().c_str(),
              cuda ? "GPU" : "small CPU", args.rounds);

  // 1. Overhead over the plain model.
  const int64_t width = cuda ? 4096 : 256, depth = 8, batch = cuda ? 4096 : 128;
  torch::nn::Sequential mlp;
  for (int64_t k = 0; k < depth; ++k) {
    mlp->push_back(torch::nn::Linear(width, width));
    mlp->push_back(torch::nn::ReLU());
  }
  mlp->to(device);
  const torch::Tensor x = torch::randn({batch, width}, device);
  const torch::Tensor y =
      torch::randint(0, width, {batch}, torch::TensorOptions(device).dtype(torch::kLong));
  const Result plain =
      measure(training_step([&](const torch::Tensor& input) { return mlp->forward(input); },
                            mlp->parameters(), x, y),
              device, args.rounds);
  gpipe::bench::Table overhead({"model", "step ms", "vs plain"});
  overhead.add({"plain", fixed(plain.milliseconds, 2), "1.000x"});
  nlohmann::json overhead_json{
      {"width", width}, {"depth", depth}, {"batch", batch}, {"plain_ms", plain.milliseconds}};
  for (const int64_t chunks : {1, 4, 8}) {
    gpipe::GPipe pipe(mlp, gpipe::GPipeOptions({2 * depth})
                               .devices({device})
                               .chunks(chunks)
                               .checkpoint(gpipe::CheckpointMode::kNever));
    const Result r =
        measure(training_step([&](const torch::Tensor& input) { return pipe->forward(input); },
                              pipe->parameters(), x, y),
                device, args.rounds);
    const double ratio = r.milliseconds / plain.milliseconds;
    overhead.add({"GPipe chunks " + std::to_string(chunks), fixed(r.milliseconds, 2),
                  gpipe::bench::times(ratio)});
    overhead_json["gpipe"].push_back(
        {{"chunks", chunks}, {"ms", r.milliseconds}, {"ratio", ratio}});
  }
  overhead.print();
  report["overhead"] = overhead_json;

  // 2. ResNet-101 pipelines on the one device.
  const int64_t images = cuda ? 128 : 32, side = cuda ? 224 : 32;
  torch::nn::Sequential resnet =
      cuda ? gpipe::models::resnet101()
           : gpipe::models::resnet(gpipe::models::ResNetOptions({1, 1, 1, 1}));
  resnet->to(device);
  const torch::Tensor input = torch::randn({images, 3, side, side}, device);
  const torch::Tensor target =
      torch::randint(0, 1000, {images}, torch::TensorOptions(device).dtype(torch::kLong));
  std::printf("\n%s, batch %lld of %lldx%lld, chunks 8 (pipeline-k: k partitions on %s)\n",
              cuda ? "ResNet-101" : "ResNet [1,1,1,1]", static_cast<long long>(images),
              static_cast<long long>(side), static_cast<long long>(side), device.str().c_str());
  gpipe::bench::Table pipelines({"model", "step ms", "peak MiB"});
  const Result base =
      measure(training_step([&](const torch::Tensor& in) { return resnet->forward(in); },
                            resnet->parameters(), input, target),
              device, args.rounds);
  pipelines.add({"plain", fixed(base.milliseconds, 1), fixed(base.peak_mib, 1)});
  nlohmann::json resnet_json{{"images", images},
                             {"side", side},
                             {"plain", {{"ms", base.milliseconds}, {"peak_mib", base.peak_mib}}}};
  const auto layers = static_cast<int64_t>(resnet->size());
  for (const int64_t k : {2, 4, 8}) {
    gpipe::GPipe pipe(resnet, gpipe::GPipeOptions(gpipe::balance::balance_by_count(k, layers))
                                  .devices(std::vector<c10::Device>(k, device))
                                  .chunks(8));
    const Result r =
        measure(training_step([&](const torch::Tensor& in) { return pipe->forward(in); },
                              pipe->parameters(), input, target),
                device, args.rounds);
    pipelines.add(
        {"pipeline-" + std::to_string(k), fixed(r.milliseconds, 1), fixed(r.peak_mib, 1)});
    resnet_json["pipelines"].push_back(
        {{"k", k}, {"ms", r.milliseconds}, {"peak_mib", r.peak_mib}});
  }
  pipelines.print();
  report["resnet"] = resnet_json;
  gpipe::bench::write_json(args, report);
}

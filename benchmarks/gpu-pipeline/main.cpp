// gpu_pipeline: the GPU check's benchmark (scripts/gpu-check.sh), on one device: cuda:0, or the
// CPU at small sizes (so that CI runs it).
//
// 1. GPipe's overhead: a plain Sequential against GPipe over the same model in one partition, at
//    chunks 1, 4 and 8 (no checkpointing); the ratio is GPipe's step time over the plain one's.
// 2. Side by side with torchgpipe 0.0.7: ResNet-101, U-Net and AmoebaNet-D, each plain and as
//    pipelines of 2, 4 and 8 partitions all on the one device (each partition with its own
//    streams, so Copy/Wait and record_stream run), chunks 8, checkpoint except_last. gpipe runs
//    here; torchgpipe runs in a Python process (torchgpipe_side.py) on the twins of the models
//    (twin_models.py), loaded with the same weights, input and target. Each contender trains its
//    own copy of the model on both sides; every round steps each contender once on each side,
//    who goes first alternating by round. Before any step, both sides' forward losses must agree:
//    the twins compute the same model. Peak memory: the caching allocator's on CUDA, the tracking
//    allocator's on the CPU (torchgpipe's is not measured on the CPU). --trace DIR profiles one
//    step more of some contenders on each side (profiled_step.h; trace_summary.py reads them).
#include "common/bench_util.h"
#include "gpu-pipeline/python_peer.h"
#include "gpu-pipeline/side_by_side.h"
#include "models/amoebanet.h"
#include "models/resnet.h"
#include "models/unet.h"

#include <gpipe/gpipe.h>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <stdexcept>

namespace {

using gpipe::bench::fixed;
using gpipe::bench::Measurement;
using gpipe::bench::median;

// The median step time and peak memory over `rounds` steps after one warm-up step.
Measurement measure(const std::function<void()>& step, const c10::Device& device, int rounds) {
  gpipe::bench::time_step(step, device);
  std::vector<double> times, peaks;
  for (int round = 0; round < rounds; ++round) {
    const Measurement one = gpipe::bench::time_step(step, device);
    times.push_back(one.milliseconds);
    peaks.push_back(one.peak_mib);
  }
  return {median(times), median(peaks)};
}

// 1. GPipe in one partition at chunks 1, 4, 8 against the plain model.
nlohmann::json overhead(const c10::Device& device, bool full, int rounds) {
  const int64_t width = full ? 4096 : 256, depth = 8, batch = full ? 4096 : 128;
  torch::nn::Sequential mlp;
  for (int64_t k = 0; k < depth; ++k) {
    mlp->push_back(torch::nn::Linear(width, width));
    mlp->push_back(torch::nn::ReLU());
  }
  mlp->to(device);
  const torch::Tensor x = torch::randn({batch, width}, device);
  const torch::Tensor y =
      torch::randint(0, width, {batch}, torch::TensorOptions(device).dtype(torch::kLong));
  const auto step = [&](const gpipe::bench::Forward& forward,
                        const std::vector<torch::Tensor>& parameters) {
    return gpipe::bench::training_step(forward, parameters, x, y);
  };
  const Measurement plain =
      measure(step([&](const torch::Tensor& in) { return mlp->forward(in); }, mlp->parameters()),
              device, rounds);
  gpipe::bench::Table table({"model", "step ms", "vs plain"});
  table.add({"plain", fixed(plain.milliseconds, 2), "1.000x"});
  nlohmann::json report{
      {"width", width}, {"depth", depth}, {"batch", batch}, {"plain_ms", plain.milliseconds}};
  for (const int64_t chunks : {1, 4, 8}) {
    gpipe::GPipe pipe(mlp, gpipe::GPipeOptions({2 * depth})
                               .devices({device})
                               .chunks(chunks)
                               .checkpoint(gpipe::CheckpointMode::kNever));
    const Measurement r = measure(
        step([&](const torch::Tensor& in) { return pipe->forward(in); }, pipe->parameters()),
        device, rounds);
    const double ratio = r.milliseconds / plain.milliseconds;
    table.add({"GPipe chunks " + std::to_string(chunks), fixed(r.milliseconds, 2),
               gpipe::bench::times(ratio)});
    report["gpipe"].push_back({{"chunks", chunks}, {"ms", r.milliseconds}, {"ratio", ratio}});
  }
  std::printf("GPipe in one partition against the plain model (%lld x Linear(%lld), batch %lld)\n",
              static_cast<long long>(depth), static_cast<long long>(width),
              static_cast<long long>(batch));
  table.print();
  return report;
}

// 2. The models side by side: the GPU sizes of torchgpipe's benchmarks (U-Net and AmoebaNet-D
// at batches that one GPU holds), or small ones for the CPU. U-Net without dropout, so that both
// sides compute the same loss.
std::vector<gpipe::bench::ModelCase> model_cases(bool full) {
  namespace models = gpipe::models;
  const int64_t resnet_width = full ? 64 : 16, unet_base = full ? 64 : 8,
                unet_depth = full ? 5 : 3, unet_convs = full ? 5 : 2,
                amoeba_filters = full ? 256 : 32, amoeba_layers = full ? 18 : 6;
  const std::vector<int64_t> resnet_layers =
      full ? std::vector<int64_t>{3, 4, 23, 3} : std::vector<int64_t>{1, 1, 1, 1};
  const int64_t image = full ? 224 : 64, unet_image = full ? 192 : 64;
  return {
      {full ? "ResNet-101" : "ResNet [1,1,1,1]",
       "resnet",
       {{"layers", resnet_layers}, {"base_width", resnet_width}},
       [=] {
         return models::resnet(models::ResNetOptions(resnet_layers).base_width(resnet_width));
       },
       {full ? 128 : 32, 3, image, image},
       {},
       1000},
      {full ? "U-Net (5, 64)" : "U-Net (3, 8)",
       "unet",
       {{"depth", unet_depth},
        {"num_convs", unet_convs},
        {"base_channels", unet_base},
        {"dropout", 0.0}},
       [=] {
         return models::unet(models::UNetOptions()
                                 .depth(unet_depth)
                                 .num_convs(unet_convs)
                                 .base_channels(unet_base)
                                 .dropout(0.0));
       },
       {full ? 32 : 16, 3, unet_image, unet_image},
       {full ? 32 : 16, 1, unet_image, unet_image},
       0},
      {full ? "AmoebaNet-D (18, 256)" : "AmoebaNet-D (6, 32)",
       "amoebanetd",
       {{"num_layers", amoeba_layers}, {"num_filters", amoeba_filters}},
       [=] {
         return models::amoebanetd(
             models::AmoebaNetOptions().num_layers(amoeba_layers).num_filters(amoeba_filters));
       },
       {full ? 64 : 16, 3, image, image},
       {},
       1000},
  };
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = torch::cuda::is_available() ? "cuda" : "cpu";
  std::string python = gpipe::bench::default_python();
  std::string with_torchgpipe = "yes";
  std::string trace_dir;
  const auto args = gpipe::bench::parse_args(
      argc, argv, "gpu_pipeline",
      "GPipe's overhead over the plain model (chunks 1, 4, 8), then ResNet-101, U-Net and\n"
      "AmoebaNet-D pipelines of k partitions on one device side by side with torchgpipe 0.0.7\n"
      "(run by --python, which must import torch and torchgpipe). On the CPU, small sizes\n"
      "unless --paper.",
      /*default_rounds=*/5,
      {{"--device", &device_name, "cuda (cuda:0) or cpu"},
       {"--python", &python, "the Python that runs torchgpipe"},
       {"--torchgpipe", &with_torchgpipe, "yes, or no to run gpipe's side alone"},
       {"--trace", &trace_dir, "a folder for one profiled step of plain, pipeline-8, arithmetic"}});
  if (device_name != "cuda" && device_name != "cpu") {
    std::fprintf(stderr, "gpu_pipeline: --device must be cuda or cpu, not '%s'\n",
                 device_name.c_str());
    return 2;
  }
  if (device_name == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr, "gpu_pipeline: --device cuda, but LibTorch sees no CUDA device\n");
    return 2;
  }
  if (with_torchgpipe != "yes" && with_torchgpipe != "no") {
    std::fprintf(stderr, "gpu_pipeline: --torchgpipe must be yes or no, not '%s'\n",
                 with_torchgpipe.c_str());
    return 2;
  }
  const bool cuda = device_name == "cuda", full = cuda || args.paper;
  const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (!cuda) gpipe::memory::install_tracking_cpu_allocator();
  torch::manual_seed(0);
  nlohmann::json report{{"device", device.str()}, {"rounds", args.rounds}};
  std::printf("gpu_pipeline on %s (%s sizes), median of %d steps\n\n", device.str().c_str(),
              full ? "GPU" : "small CPU", args.rounds);
  report["overhead"] = overhead(device, full, args.rounds);

  bool same_losses = true;
  try {
    std::unique_ptr<gpipe::bench::PythonPeer> peer;
    if (with_torchgpipe == "yes") {
      peer = std::make_unique<gpipe::bench::PythonPeer>(python, GPIPE_TORCHGPIPE_SIDE);
      report["torchgpipe_side"] = peer->request({{"op", "hello"}});
    }
    for (const auto& model : model_cases(full)) {
      gpipe::bench::SideBySide run(model, device, peer.get());
      run.measure(args.rounds);
      if (!trace_dir.empty()) run.trace(trace_dir);
      report["models"].push_back(run.report());
      same_losses = same_losses && run.same_losses();
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gpu_pipeline: %s (--torchgpipe no runs gpipe alone)\n", error.what());
    gpipe::bench::write_json(args, report);
    return 1;
  }
  gpipe::bench::write_json(args, report);
  if (!same_losses) {
    std::fprintf(stderr, "gpu_pipeline: gpipe's and torchgpipe's losses differ (see above)\n");
    return 1;
  }
}

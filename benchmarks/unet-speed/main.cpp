// U-Net speed: training throughput of the plain U-Net (naive-1) against GPipe pipelines of 1, 2,
// 4 and 8 partitions, its long skips crossing partitions as portals (torchgpipe's
// benchmarks/unet-speed), measured side by side in one run (common/speed.h). The model keeps
// U-Net (5, 64)'s depth and 241 layers, so the reference's balances apply; by default it is 1/8
// as wide and sees 64 x 64 images, so that the run takes about a minute on a 2-core CPU.
#include "common/bench_util.h"
#include "common/speed.h"

#include "models/unet.h"

#include <torch/torch.h>

int main(int argc, char** argv) {
  namespace bench = gpipe::bench;
  const auto args = bench::parse_args(
      argc, argv, "unet-speed",
      "U-Net (depth 5, 5 convolutions per cell) training throughput, plain vs GPipe with 1, 2,\n"
      "4, 8 partitions. Default: base channels 8, 64 x 64 images, batch 16. --paper: base\n"
      "channels 64, 192 x 192, the reference's batch sizes (40 ... 640) and chunks.",
      9);
  const int64_t base = args.paper ? 64 : 8;
  const int64_t image = args.paper ? 192 : 64;
  bench::SpeedSuite suite;
  suite.title = "U-Net (depth 5, 5 convs, base " + std::to_string(base) + "), 241 layers, " +
                std::to_string(image) + " x " + std::to_string(image) + " images";
  suite.make_model = [&] {
    return gpipe::models::unet(
        gpipe::models::UNetOptions().depth(5).num_convs(5).base_channels(base));
  };
  suite.make_data = bench::images_with_masks(image);
  suite.loss = bench::binary_cross_entropy;
  const auto except_last = gpipe::CheckpointMode::kExceptLast;
  const std::vector<int64_t> p2{104, 137}, p4{30, 66, 84, 61}, p8{16, 27, 31, 44, 22, 57, 27, 17};
  if (args.paper) {
    suite.contenders = {{"naive-1", 40},
                        {"pipeline-1", 80, {241}, 2, except_last},
                        {"pipeline-2", 512, p2, 32, except_last},
                        {"pipeline-4", 512, p4, 16, except_last},
                        {"pipeline-8", 640, p8, 40, except_last}};
  } else {
    suite.contenders = {{"naive-1", 16},
                        {"pipeline-1", 16, {241}, 2, except_last},
                        {"pipeline-2", 16, p2, 4, except_last},
                        {"pipeline-4", 16, p4, 4, except_last},
                        {"pipeline-8", 16, p8, 8, except_last},
                        {"naive-1, loop", 16, {}, 8}};
  }
  suite.notes =
      "speedup = samples/s over naive-1 (medians). torchgpipe on 8 Tesla P40s: pipeline-1/2/4/8\n"
      "= 0.858x / 1.246x / 2.352x / 3.105x. On one CPU the partitions run one after another, so\n"
      "below 1x here is the cost of micro-batching and checkpointing, not of the pipeline;\n"
      "\"naive-1, loop\" runs the plain model on pipeline-8's micro-batches one by one.\n";
  suite.config = {
      {"model", "unet"}, {"depth", 5}, {"num_convs", 5}, {"base_channels", base}, {"image", image}};
  return bench::run_speed_suite(args, "unet-speed", suite);
}

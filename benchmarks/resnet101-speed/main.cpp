// ResNet-101 speed: training throughput of the plain model (naive-1) against GPipe pipelines of
// 1, 2, 4 and 8 partitions (torchgpipe's benchmarks/resnet101-speed, the GPipe paper's Figure
// 3(b)), measured side by side in one run (common/speed.h). The model keeps ResNet-101's 370
// layers, so the reference's balances apply at every size; by default it is 1/4 as wide and
// sees 64 x 64 images, so that the run takes about a minute on a 2-core CPU.
#include "common/bench_util.h"
#include "common/speed.h"

#include "models/resnet.h"

#include <torch/torch.h>

int main(int argc, char** argv) {
  namespace bench = gpipe::bench;
  const auto args = bench::parse_args(
      argc, argv, "resnet101-speed",
      "ResNet-101 training throughput, plain vs GPipe with 1, 2, 4, 8 partitions.\n"
      "Default: base width 16, 64 x 64 images, batch 16. --paper: width 64, 224 x 224, the\n"
      "reference's batch sizes (118 ... 25000) and chunks.",
      5);
  const int64_t width = args.paper ? 64 : 16;
  const int64_t image = args.paper ? 224 : 64;
  bench::SpeedSuite suite;
  suite.title = "ResNet-101 (base width " + std::to_string(width) + ", 370 layers), " +
                std::to_string(image) + " x " + std::to_string(image) + " images, 1000 classes";
  suite.make_model = [&] {
    return gpipe::models::resnet(gpipe::models::ResNetOptions({3, 4, 23, 3}).base_width(width));
  };
  suite.make_data = bench::images_with_classes(image, 1000);
  suite.loss = bench::cross_entropy;
  // The reference's experiments: (batch, chunks) were tuned for 8 Tesla P40s; here, by default,
  // one batch for all and chunks growing with the partitions, as there.
  const auto except_last = gpipe::CheckpointMode::kExceptLast;
  if (args.paper) {
    suite.contenders = {{"naive-1", 118},
                        {"pipeline-1", 220, {370}, 2, except_last},
                        {"pipeline-2", 25000, {135, 235}, 1667, except_last},
                        {"pipeline-4", 5632, {44, 92, 124, 110}, 256, except_last},
                        {"pipeline-8", 5400, {26, 22, 33, 44, 44, 66, 66, 69}, 150, except_last}};
  } else {
    suite.contenders = {{"naive-1", 16},
                        {"pipeline-1", 16, {370}, 2, except_last},
                        {"pipeline-2", 16, {135, 235}, 4, except_last},
                        {"pipeline-4", 16, {44, 92, 124, 110}, 8, except_last},
                        {"pipeline-8", 16, {26, 22, 33, 44, 44, 66, 66, 69}, 16, except_last},
                        {"naive-1, loop", 16, {}, 16}};
  }
  suite.notes =
      "speedup = samples/s over naive-1 (medians). torchgpipe on 8 Tesla P40s: pipeline-1/2/4/8\n"
      "= 0.853x / 1.414x / 2.774x / 4.294x. On one CPU the partitions run one after another, so\n"
      "below 1x here is the cost of micro-batching and checkpointing, not of the pipeline;\n"
      "\"naive-1, loop\" runs the plain model on pipeline-8's micro-batches one by one.\n";
  suite.config = {{"model", "resnet101"}, {"base_width", width}, {"image", image}};
  return bench::run_speed_suite(args, "resnet101-speed", suite);
}

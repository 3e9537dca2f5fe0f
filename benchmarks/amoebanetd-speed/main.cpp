// AmoebaNet-D speed: training throughput of GPipe with n = 2, 4, 8 partitions and m = 1, 4, 32
// micro-batches (torchgpipe's benchmarks/amoebanetd-speed, the GPipe paper's Table 2), and of
// the plain model, measured side by side in one run (common/speed.h). The model keeps
// AmoebaNet-D (18, D)'s 24 layers, so the reference's balances apply; by default D = 32 and the
// images are 64 x 64, so that the run takes about a minute on a 2-core CPU.
#include "common/bench_util.h"
#include "common/speed.h"

#include "models/amoebanet.h"

#include <torch/torch.h>

int main(int argc, char** argv) {
  namespace bench = gpipe::bench;
  const auto args = bench::parse_args(
      argc, argv, "amoebanetd-speed",
      "AmoebaNet-D (18, D) training throughput, GPipe with n partitions and m micro-batches,\n"
      "and the plain model. Default: D = 32, 64 x 64 images, batch 32. --paper: D = 256,\n"
      "224 x 224, the reference's batch sizes (96 ... 1280).",
      3);
  const int64_t filters = args.paper ? 256 : 32;
  const int64_t image = args.paper ? 224 : 64;
  bench::SpeedSuite suite;
  suite.title = "AmoebaNet-D (18, " + std::to_string(filters) + "), 24 layers, " +
                std::to_string(image) + " x " + std::to_string(image) + " images, 1000 classes";
  suite.make_model = [&] {
    return gpipe::models::amoebanetd(
        gpipe::models::AmoebaNetOptions().num_layers(18).num_filters(filters));
  };
  suite.make_data = bench::images_with_classes(image, 1000);
  suite.loss = bench::cross_entropy;
  // The reference's experiments: m = 1 checkpoints always, the others all but the last.
  const auto always = gpipe::CheckpointMode::kAlways;
  const auto except_last = gpipe::CheckpointMode::kExceptLast;
  const std::vector<int64_t> n2{9, 15}, n4{3, 6, 7, 8}, n8{2, 2, 2, 3, 3, 4, 4, 4};
  if (args.paper) {
    suite.contenders = {{"n=2, m=1", 96, {7, 17}, 1, always},
                        {"n=2, m=4", 256, n2, 4, except_last},
                        {"n=2, m=32", 1280, n2, 32, except_last},
                        {"n=4, m=1", 160, {3, 4, 5, 12}, 1, always},
                        {"n=4, m=4", 360, n4, 4, except_last},
                        {"n=4, m=32", 1152, n4, 32, except_last},
                        {"n=8, m=1", 196, {2, 2, 2, 2, 2, 3, 4, 7}, 1, always},
                        {"n=8, m=4", 480, n8, 4, except_last},
                        {"n=8, m=32", 1280, n8, 32, except_last},
                        {"naive-1", 96}};
  } else {
    const int64_t batch = 32;
    suite.contenders = {{"n=2, m=1", batch, {7, 17}, 1, always},
                        {"n=2, m=4", batch, n2, 4, except_last},
                        {"n=2, m=32", batch, n2, 32, except_last},
                        {"n=4, m=1", batch, {3, 4, 5, 12}, 1, always},
                        {"n=4, m=4", batch, n4, 4, except_last},
                        {"n=4, m=32", batch, n4, 32, except_last},
                        {"n=8, m=1", batch, {2, 2, 2, 2, 2, 3, 4, 7}, 1, always},
                        {"n=8, m=4", batch, n8, 4, except_last},
                        {"n=8, m=32", batch, n8, 32, except_last},
                        {"naive-1", batch},
                        {"naive-1, loop", batch, {}, 32}};
  }
  suite.notes =
      "speedup = samples/s over n=2, m=1 (medians), as in the reference's table. torchgpipe on\n"
      "8 Tesla P40s: n=8 m=1 / m=4 / m=32 = 0.932x / 2.625x / 4.966x (GPipe paper: 1.38x / 1.72x\n"
      "/ 3.48x). On one CPU the partitions run one after another: only the cost of micro-batches\n"
      "(smaller, less efficient kernels) and checkpointing (m = 1 recomputes everything) shows;\n"
      "\"naive-1, loop\" runs the plain model on 32 micro-batches one by one.\n";
  suite.config = {
      {"model", "amoebanetd"}, {"num_layers", 18}, {"num_filters", filters}, {"image", image}};
  return bench::run_speed_suite(args, "amoebanetd-speed", suite);
}

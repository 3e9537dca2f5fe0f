// U-Net timeline: torchgpipe's ablation (benchmarks/unet-timeline) on this GPipe - throughput
// and peak memory of U-Net (5, 64)'s pipeline as its optimizations are taken away, measured side
// by side in one run (common/speed.h).
//
// The reference toggles three things: the backward-order dependency (fork/join phonies), the
// copy streams, and portals for the skips (against "tuplified" skips carried through every
// layer). In this codebase only the last can be taken away without changing the core:
// unet_carrying_skips() is the same model carrying its skips. The fork/join edges are built by
// the pipeline's fence unconditionally (no option switches them off), and on the CPU the copy
// streams are placeholders that do nothing, so "without dependency" and "without streams" are
// not measured. In their place this benchmark varies what GPipe does expose: the checkpoint mode.
// GPU utilization (the reference's other column) has no CPU counterpart.
#include "common/bench_util.h"
#include "common/speed.h"

#include "models/unet.h"

#include <torch/torch.h>

int main(int argc, char** argv) {
  namespace bench = gpipe::bench;
  const auto args = bench::parse_args(
      argc, argv, "unet-timeline",
      "U-Net ablation: skips as portals vs carried through every partition, for each\n"
      "checkpoint mode, and the plain model; balance [34, 76, 70, 61], 8 chunks. Default: base\n"
      "channels 8, batch 16 x 3 x 64 x 64. --paper: base channels 64, 128 x 3 x 192 x 192.\n"
      "Without dependency / without streams cannot be toggled here (see the source).",
      7);
  const int64_t base = args.paper ? 64 : 8;
  const int64_t image = args.paper ? 192 : 64;
  const int64_t batch = args.paper ? 128 : 16;
  const auto options = gpipe::models::UNetOptions().depth(5).num_convs(5).base_channels(base);
  auto portals = [&] { return gpipe::models::unet(options); };
  auto carrying = [&] { return gpipe::models::unet_carrying_skips(options); };
  const std::vector<int64_t> balance{34, 76, 70, 61};
  const int64_t chunks = 8;
  bench::SpeedSuite suite;
  suite.title = "U-Net (depth 5, 5 convs, base " + std::to_string(base) + "), 241 layers, batch " +
                std::to_string(batch) + " x 3 x " + std::to_string(image) + " x " +
                std::to_string(image);
  suite.make_model = portals;
  suite.make_data = bench::images_with_masks(image);
  suite.loss = bench::binary_cross_entropy;
  suite.partitions = balance.size();
  for (const auto mode : {gpipe::CheckpointMode::kExceptLast, gpipe::CheckpointMode::kNever,
                          gpipe::CheckpointMode::kAlways}) {
    const std::string suffix = ", " + bench::describe(mode);
    suite.contenders.push_back(
        {"dep-str-ptl (portals)" + suffix, batch, balance, chunks, mode, portals});
    suite.contenders.push_back(
        {"dep-str-x (carrying)" + suffix, batch, balance, chunks, mode, carrying, true});
  }
  suite.contenders.push_back({"naive-1 (plain)", batch, {}, 1, {}, portals});
  suite.contenders.push_back({"naive-1 (plain), loop", batch, {}, chunks, {}, portals});
  suite.notes =
      "speedup = samples/s over the first row, GPipe's default (medians). torchgpipe on 4 Tesla\n"
      "P40s: baseline (no dependency, no streams, carried skips) 30.7/s, dep-x-x 41.3/s,\n"
      "dep-str-x 55.2/s, dep-str-ptl 58.5/s; memory 52.2 / 19.1 / 30.0 / 23.5 GiB.\n"
      "Not measured here: baseline and dep-x-x (no switch for the dependency in GPipe; streams\n"
      "are no-ops on the CPU). On one CPU device a carried skip is passed by reference, so only\n"
      "what portals save in bookkeeping shows, not the copies they save between devices.\n"
      "\"loop\" runs the plain model on the same 8 micro-batches one by one.\n";
  suite.config = {{"model", "unet"},
                  {"depth", 5},
                  {"num_convs", 5},
                  {"base_channels", base},
                  {"image", image},
                  {"balance", balance},
                  {"chunks", chunks},
                  {"not_measured",
                   {"without dependency: the fork/join phonies are always built by GPipe's fence",
                    "without streams: copy streams are CPU placeholders, nothing to switch off"}}};
  return bench::run_speed_suite(args, "unet-timeline", suite);
}

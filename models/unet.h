// U-Net as a flat Sequential, its long skips as gpipe::skip stashes and pops: torchgpipe's
// benchmark model (benchmarks/models/unet), for tests and benchmarks.
//
//   [ encoder ]--------------[ decoder ]--[ segment ]
//      [ encoder ]--------[ decoder ]
//         [ encoder ]--[ decoder ]
//              [ bottleneck ]
//
// Each encoder level ends in a Stash of its output (isolated in the level's namespace) and a
// 2x2 max-pool; each decoder level starts with a 2x upsample and a PopCat that concatenates the
// stashed tensor along the channels. A cell is `num_convs` x (Conv3x3, Dropout2d, InstanceNorm,
// LeakyReLU), each a layer of its own, so the Sequential can be cut anywhere.
//
// unet_carrying_skips() builds the same model (same layers, same initialization for the same
// seed) that passes the skip tensors along as extra outputs of every layer instead: its layers
// take and return std::vector<Tensor>{main, skip_0, skip_1, ...}. The benchmarks compare the two.
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>

namespace gpipe {
namespace models {

struct UNetOptions {
  /// Levels of encoders and decoders; the input's height and width must divide by 2^depth.
  TORCH_ARG(int64_t, depth) = 5;
  /// Convolutions per cell.
  TORCH_ARG(int64_t, num_convs) = 5;
  /// Channels of the first encoder; level i has base_channels * 2^i.
  TORCH_ARG(int64_t, base_channels) = 64;
  TORCH_ARG(int64_t, input_channels) = 3;
  TORCH_ARG(int64_t, output_channels) = 1;
  /// Dropout2d probability in every cell (0 makes the model deterministic).
  TORCH_ARG(double, dropout) = 0.1;
};

/// The U-Net, skips as stash/pop (torchgpipe's unet(depth, num_convs, base_channels, ...)).
/// Throws c10::ValueError for a non-positive size.
torch::nn::Sequential unet(const UNetOptions& options = {});

/// The same U-Net, skips carried through every layer as extra outputs. Its input and output are
/// std::vector<Tensor>; the output holds the segmentation alone.
torch::nn::Sequential unet_carrying_skips(const UNetOptions& options = {});

}  // namespace models
}  // namespace gpipe

// ResNet (bottleneck) as a flat Sequential, each residual a gpipe::skip stash and pop:
// torchgpipe's benchmark model (benchmarks/models/resnet), for tests and benchmarks.
//
// A bottleneck block is 11 layers: Identity (stashes its input), conv1x1, bn, relu, conv3x3 (the
// block's stride), bn, relu, conv1x1 (4x wider), bn, Residual (pops the input, downsamples it
// when the shape changes, adds), relu; the block's stash and pop share a namespace of their own.
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <vector>

namespace gpipe {
namespace models {

struct ResNetOptions {
  /* implicit */ ResNetOptions(std::vector<int64_t> layers) : layers_(std::move(layers)) {}
  /// Bottleneck blocks in each of the four stages; ResNet-101 is {3, 4, 23, 3}. Required.
  TORCH_ARG(std::vector<int64_t>, layers);
  TORCH_ARG(int64_t, num_classes) = 1000;
  /// Channels of the stem and the first stage's bottleneck; 64 in ResNet.
  TORCH_ARG(int64_t, base_width) = 64;
};

/// The ResNet. Throws c10::ValueError unless there are four positive stage sizes and positive
/// widths.
torch::nn::Sequential resnet(const ResNetOptions& options);

/// ResNet-101: resnet({3, 4, 23, 3}).
torch::nn::Sequential resnet101(int64_t num_classes = 1000);

}  // namespace models
}  // namespace gpipe

// AmoebaNet-D as a flat Sequential: torchgpipe's benchmark model (benchmarks/models/amoebanet),
// the GPipe paper's image classifier, for tests and benchmarks.
//
//   stem1 (conv) - stem2, stem3 (reduction cells) - L/3 normal cells - reduction cell
//   - L/3 normal cells - reduction cell - L/3 normal cells - classify
//
// A cell reads the outputs of the two cells before it. The layers carry both as a list:
// every cell takes std::vector<Tensor>{previous, before previous} (one tensor, used as both, for
// the first cell) and returns {its output, previous}, which is how GPipe passes them from
// partition to partition (as torchgpipe passes the tuple). The stem returns a list of one tensor;
// classify takes the list and returns the logits.
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>

namespace gpipe {
namespace models {

struct AmoebaNetOptions {
  /// Normal cells in all, L: a multiple of 3, spread evenly over the three groups. The model has
  /// L + 6 layers. Default: 18, AmoebaNet-D (18, 256) of the GPipe paper's speed benchmark.
  TORCH_ARG(int64_t, num_layers) = 18;
  /// Filters D: the stem has D / 4 channels, each reduction doubles them. At least 8, so that
  /// every convolution keeps a channel.
  TORCH_ARG(int64_t, num_filters) = 256;
  TORCH_ARG(int64_t, num_classes) = 1000;
};

/// AmoebaNet-D (L, D) (torchgpipe's amoebanetd). Takes images N x 3 x H x W (224 x 224 in the
/// paper; any size from 32 x 32 works, the classifier pools globally). Throws c10::ValueError for
/// a bad size.
torch::nn::Sequential amoebanetd(const AmoebaNetOptions& options = {});

}  // namespace models
}  // namespace gpipe

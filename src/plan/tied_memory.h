// What a rank holds more for a parameter that its layers share with another rank's (tied
// weights, PlanOptions::ranks): each rank keeps its own copy, and after the step's actions the
// copies' gradients are summed across the ranks (distributed/rank_parameters.h).
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <vector>

namespace gpipe {
namespace plan_detail {

/// A parameter that two or more layers hold: which layers, and its size.
struct TiedParameter {
  std::vector<int64_t> layers;  ///< increasing
  int64_t bytes = 0;
  int64_t numel = 0;
};

/// The parameters of `model` that more than one of its layers hold, in order of first appearance.
std::vector<TiedParameter> tied_parameters(const torch::nn::Sequential& model);

/// What `worker` holds more through a step for the parameters tied to layers of other workers,
/// each a rank, where layer k runs on worker_of_layer[k]: the receive of each other rank's part of
/// the gradient, in double precision, posted as the step begins; and the gradient the step makes
/// beside the one accumulated before it, set aside meanwhile (as if gradients are kept between
/// steps).
int64_t tied_bytes_between_ranks(const std::vector<TiedParameter>& tied,
                                 const std::vector<int64_t>& worker_of_layer, int64_t worker);

}  // namespace plan_detail
}  // namespace gpipe

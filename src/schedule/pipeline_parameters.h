// The parameters of a pipeline's stages as the plain model has them: each one once, in the
// model's order, with the stages that use it. A parameter used by several stages is tied (e.g. a
// language model's token embedding, reused as its output projection): one tensor, whose
// gradient is the sum of what every stage that uses it contributes.
//
// LibTorch's Module::parameters() lists a tied parameter once per module that registers it; an
// optimizer given that list would update it twice. The engines' parameters() give each once.
//
// Internal to the engines.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpipe {
namespace detail {

/// One parameter of a pipeline.
struct PipelineParameter {
  std::string name;             ///< its name in the whole model where it first appears
  at::Tensor tensor;            ///< the parameter itself
  std::vector<int64_t> stages;  ///< the stages that use it, in increasing order

  bool tied() const { return stages.size() > 1; }
};

/// Every parameter of `stages` once, in order of first appearance (stage by stage, module by
/// module, as the whole model's parameters()), with the stages that use it; a tensor is the same
/// parameter wherever it appears. `stages` are the whole model's layers in order, each keeping its
/// name (split.h).
std::vector<PipelineParameter> pipeline_parameters(
    const std::vector<torch::nn::Sequential>& stages);

/// The tensors of `parameters` that any of `stages` uses, each once, in order; with `stages`
/// empty, all of them.
std::vector<at::Tensor> tensors_of(const std::vector<PipelineParameter>& parameters,
                                   const std::vector<int64_t>& stages = {});

/// Throws c10::ValueError naming the first tied parameter whose stages are on different devices:
/// a tied parameter is one tensor, which lives on one device. `devices[s]` is stage s's device.
void check_tied_devices(const std::vector<PipelineParameter>& parameters,
                        const std::vector<c10::Device>& devices);

}  // namespace detail
}  // namespace gpipe

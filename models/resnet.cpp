#include "models/resnet.h"

#include <gpipe/skip/skippable.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <string>

namespace gpipe {
namespace models {
namespace {

using torch::nn::Sequential;

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

struct IdentityImpl : torch::nn::Module, skip::Skippable {
  IdentityImpl() : Skippable({"identity"}, {}) {}
  torch::Tensor forward(torch::Tensor input) {
    stash("identity", input);
    return input;
  }
};
TORCH_MODULE(Identity);

// Adds the block's input, downsampled when the block changes its shape.
struct ResidualImpl : torch::nn::Module, skip::Skippable {
  explicit ResidualImpl(Sequential downsample) : Skippable({}, {"identity"}) {
    if (downsample) downsample_ = register_module("downsample", downsample);
  }
  torch::Tensor forward(torch::Tensor input) {
    torch::Tensor identity = pop("identity");
    if (downsample_) identity = downsample_->forward(identity);
    return input + identity;
  }
  Sequential downsample_{nullptr};
};
TORCH_MODULE(Residual);

void add_bottleneck(Sequential& model, const std::string& name, int64_t inplanes, int64_t planes,
                    int64_t stride) {
  Sequential downsample{nullptr};
  if (stride != 1 || inplanes != planes * 4) {
    downsample =
        Sequential(conv(inplanes, planes * 4, 1, stride), torch::nn::BatchNorm2d(planes * 4));
  }
  skip::Namespace ns;
  model->push_back(name + "_identity", skip::isolate(Identity(), ns));
  model->push_back(name + "_conv1", conv(inplanes, planes, 1));
  model->push_back(name + "_bn1", torch::nn::BatchNorm2d(planes));
  model->push_back(name + "_relu1", torch::nn::ReLU());
  model->push_back(name + "_conv2", conv(planes, planes, 3, stride));
  model->push_back(name + "_bn2", torch::nn::BatchNorm2d(planes));
  model->push_back(name + "_relu2", torch::nn::ReLU());
  model->push_back(name + "_conv3", conv(planes, planes * 4, 1));
  model->push_back(name + "_bn3", torch::nn::BatchNorm2d(planes * 4));
  model->push_back(name + "_residual", skip::isolate(Residual(downsample), ns));
  model->push_back(name + "_relu3", torch::nn::ReLU());
}

}  // namespace

Sequential resnet(const ResNetOptions& options) {
  const auto& layers = options.layers();
  TORCH_CHECK_VALUE(layers.size() == 4 &&
                        std::all_of(layers.begin(), layers.end(), [](int64_t n) { return n > 0; }),
                    "ResNet needs four positive stage sizes, but got ", c10::IntArrayRef(layers));
  TORCH_CHECK_VALUE(options.base_width() > 0 && options.num_classes() > 0,
                    "ResNet widths must be positive (base_width ", options.base_width(),
                    ", num_classes ", options.num_classes(), ")");
  const int64_t base = options.base_width();
  Sequential model;
  model->push_back(
      "conv1",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, base, 7).stride(2).padding(3).bias(false)));
  model->push_back("bn1", torch::nn::BatchNorm2d(base));
  model->push_back("relu", torch::nn::ReLU());
  model->push_back("maxpool",
                   torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)));
  int64_t inplanes = base;
  for (const auto stage : c10::irange(4)) {
    const int64_t planes = base << stage;
    for (const auto block : c10::irange(layers[stage])) {
      const int64_t stride = stage > 0 && block == 0 ? 2 : 1;
      add_bottleneck(model, "layer" + std::to_string(stage + 1) + "_" + std::to_string(block),
                     inplanes, planes, stride);
      inplanes = planes * 4;
    }
  }
  model->push_back("avgpool",
                   torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions({1, 1})));
  model->push_back("flat", torch::nn::Flatten());
  model->push_back("fc", torch::nn::Linear(inplanes, options.num_classes()));

  // torchvision's initialization.
  for (auto& module : model->modules(/*include_self=*/false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
      torch::nn::init::ones_(bn->weight);
      torch::nn::init::zeros_(bn->bias);
    }
  }
  return model;
}

Sequential resnet101(int64_t num_classes) {
  return resnet(ResNetOptions({3, 4, 23, 3}).num_classes(num_classes));
}

}  // namespace models
}  // namespace gpipe

#include "models/unet.h"

#include <gpipe/skip/skippable.h>
#include <torch/nn/functional/padding.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/modules/upsampling.h>

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <string>
#include <vector>

namespace gpipe {
namespace models {
namespace {

using torch::nn::AnyModule;
using torch::nn::Sequential;

// Pads `input` at the end of each spatial dim to `skip`'s size, then concatenates the channels.
torch::Tensor pad_cat(torch::Tensor input, const torch::Tensor& skip) {
  if (input.sizes().slice(2) != skip.sizes().slice(2)) {
    std::vector<int64_t> pad;
    for (int64_t d = input.dim() - 1; d >= 2; --d) {
      pad.push_back(0);
      pad.push_back(skip.size(d) - input.size(d));
    }
    input = torch::nn::functional::pad(input, torch::nn::functional::PadFuncOptions(pad));
  }
  return torch::cat({input, skip}, /*dim=*/1);
}

struct StashImpl : torch::nn::Module, skip::Skippable {
  StashImpl() : Skippable({"skip"}, {}) {}
  torch::Tensor forward(torch::Tensor input) {
    stash("skip", input);
    return input;
  }
};
TORCH_MODULE(Stash);

struct PopCatImpl : torch::nn::Module, skip::Skippable {
  PopCatImpl() : Skippable({}, {"skip"}) {}
  torch::Tensor forward(torch::Tensor input) { return pad_cat(std::move(input), pop("skip")); }
};
TORCH_MODULE(PopCat);

// The carrying variant: layers of std::vector<Tensor>{main, skip_0, ..., skip_k}.

// Applies a layer to the main tensor and passes the skips along.
struct OnMainImpl : torch::nn::Module {
  explicit OnMainImpl(AnyModule layer) : layer_(std::move(layer)) {
    register_module("layer", layer_.ptr());
  }
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> input) {
    input[0] = layer_.forward(input[0]);
    return input;
  }
  AnyModule layer_;
};
TORCH_MODULE(OnMain);

// Pushes a copy of the main tensor's handle onto the skips.
struct PushSkipImpl : torch::nn::Module {
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> input) {
    input.push_back(input[0]);
    return input;
  }
};
TORCH_MODULE(PushSkip);

// Pops the last skip and concatenates it to the main tensor.
struct PopCatLastImpl : torch::nn::Module {
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> input) {
    torch::Tensor skip = std::move(input.back());
    input.pop_back();
    input[0] = pad_cat(std::move(input[0]), skip);
    return input;
  }
};
TORCH_MODULE(PopCatLast);

// Builds either variant: `wrap` turns a plain layer into one of the model, `stash` and `pop_cat`
// make the skip layers of level i.
template <typename Wrap, typename MakeStash, typename MakePopCat>
Sequential build(const UNetOptions& options, Wrap wrap, MakeStash stash, MakePopCat pop_cat) {
  TORCH_CHECK_VALUE(options.depth() > 0 && options.num_convs() > 0 && options.base_channels() > 0 &&
                        options.input_channels() > 0 && options.output_channels() > 0,
                    "U-Net sizes must be positive (depth ", options.depth(), ", num_convs ",
                    options.num_convs(), ", base_channels ", options.base_channels(),
                    ", input_channels ", options.input_channels(), ", output_channels ",
                    options.output_channels(), ")");
  const int64_t depth = options.depth();
  const int64_t base = options.base_channels();
  Sequential model;
  size_t count = 0;
  auto add = [&](const std::string& name, auto layer) {
    model->push_back(name + "_" + std::to_string(count++), layer);
  };
  auto cell = [&](const std::string& name, int64_t in, int64_t mid, int64_t out) {
    for (const auto k : c10::irange(options.num_convs())) {
      const int64_t from = k == 0 ? in : mid;
      const int64_t to = k == options.num_convs() - 1 ? out : mid;
      add(name + "_conv",
          wrap(torch::nn::Conv2d(torch::nn::Conv2dOptions(from, to, 3).padding(1).bias(false))));
      add(name + "_dropout", wrap(torch::nn::Dropout2d(options.dropout())));
      add(name + "_norm", wrap(torch::nn::InstanceNorm2d(to)));
      add(name + "_relu",
          wrap(torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(1e-2))));
    }
  };
  auto channels = [&](int64_t i) { return (base << i); };  // level i's width

  for (const auto i : c10::irange(depth)) {
    const std::string name = "encoder" + std::to_string(i);
    cell(name, i == 0 ? options.input_channels() : channels(i - 1), channels(i), channels(i));
    add(name + "_skip", stash(i));
    add(name + "_down", wrap(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2).stride(2))));
  }
  cell("bottleneck", channels(depth - 1), channels(depth), channels(depth - 1));
  for (int64_t i = depth - 1; i >= 0; --i) {
    const std::string name = "decoder" + std::to_string(i);
    add(name + "_up", wrap(torch::nn::Upsample(torch::nn::UpsampleOptions()
                                                   .scale_factor(std::vector<double>{2, 2})
                                                   .mode(torch::kNearest))));
    add(name + "_skip", pop_cat(i));
    // In: the upsampled deeper level and the skip, channels(i) each. Out: channels(i - 1),
    // and base / 2 for the last decoder, as in torchgpipe.
    const int64_t out = i == 0 ? base / 2 : channels(i - 1);
    cell(name, channels(i) * 2, out, out);
  }
  add("segment",
      wrap(torch::nn::Conv2d(
          torch::nn::Conv2dOptions(base / 2, options.output_channels(), 1).bias(false))));
  return model;
}

}  // namespace

Sequential unet(const UNetOptions& options) {
  std::vector<skip::Namespace> namespaces(options.depth() > 0 ? options.depth() : 0);
  return build(
      options, [](auto layer) { return layer; },
      [&](int64_t i) { return skip::isolate(Stash(), namespaces[i]); },
      [&](int64_t i) { return skip::isolate(PopCat(), namespaces[i]); });
}

Sequential unet_carrying_skips(const UNetOptions& options) {
  return build(
      options, [](auto layer) { return OnMain(AnyModule(layer)); },
      [](int64_t) { return PushSkip(); }, [](int64_t) { return PopCatLast(); });
}

}  // namespace models
}  // namespace gpipe

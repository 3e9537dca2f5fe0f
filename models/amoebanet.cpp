#include "models/amoebanet.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/padding.h>
#include <torch/nn/modules/pooling.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <string>
#include <utility>
#include <vector>

namespace gpipe {
namespace models {
namespace {

using torch::nn::Sequential;

// A Sequential with a plain forward, so that it nests in other Sequentials.
struct BlockImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor input) { return SequentialImpl::forward(std::move(input)); }
};
TORCH_MODULE(Block);

torch::nn::Conv2d conv(int64_t in, int64_t out, torch::ExpandingArray<2> kernel,
                       torch::ExpandingArray<2> stride = 1, torch::ExpandingArray<2> padding = 0) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

Block relu_conv_bn(int64_t in, int64_t out, torch::ExpandingArray<2> kernel = 1,
                   torch::ExpandingArray<2> stride = 1, torch::ExpandingArray<2> padding = 0) {
  return Block(torch::nn::ReLU(), conv(in, out, kernel, stride, padding),
               torch::nn::BatchNorm2d(out));
}

// Halves height and width with two 1x1 convolutions, the second shifted by one pixel, each
// giving half of the output channels.
struct FactorizedReduceImpl : torch::nn::Module {
  FactorizedReduceImpl(int64_t in, int64_t out)
      : conv1(register_module("conv1", conv(in, out / 2, 1, 2))),
        conv2(register_module("conv2", conv(in, out / 2, 1, 2))),
        bn(register_module("bn", torch::nn::BatchNorm2d(out))) {}
  torch::Tensor forward(torch::Tensor input) {
    torch::Tensor x = torch::relu(input);
    torch::Tensor shifted =
        at::constant_pad_nd(x.index({at::indexing::Slice(), at::indexing::Slice(),
                                     at::indexing::Slice(1), at::indexing::Slice(1)}),
                            {0, 1, 0, 1});
    return bn(torch::cat({conv1(x), conv2(shifted)}, /*dim=*/1));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(FactorizedReduce);

// The operations a cell combines; each maps `channels` channels to as many, with `stride`.
enum class Op { kNone, kAvgPool3x3, kMaxPool3x3, kMaxPool2x2, kConv1x7_7x1, kConv1x1, kConv3x3 };

Block operation(Op op, int64_t c, int64_t stride) {
  switch (op) {
    case Op::kNone:
      if (stride == 1) return Block(torch::nn::Identity());
      return Block(FactorizedReduce(c, c));
    case Op::kAvgPool3x3:
    // torchgpipe's max_pool_3x3 is an average pool too; kept, so that the model is its model.
    case Op::kMaxPool3x3:
      return Block(torch::nn::AvgPool2d(
          torch::nn::AvgPool2dOptions(3).stride(stride).padding(1).count_include_pad(false)));
    case Op::kMaxPool2x2:
      return Block(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2).stride(stride)));
    case Op::kConv1x7_7x1:
      return Block(relu_conv_bn(c, c / 4), relu_conv_bn(c / 4, c / 4, {1, 7}, {1, stride}, {0, 3}),
                   relu_conv_bn(c / 4, c / 4, {7, 1}, {stride, 1}, {3, 0}), relu_conv_bn(c / 4, c));
    case Op::kConv1x1:
      return relu_conv_bn(c, c, 1, stride);
    case Op::kConv3x3:
      return Block(relu_conv_bn(c, c / 4), relu_conv_bn(c / 4, c / 4, 3, stride, 1),
                   relu_conv_bn(c / 4, c));
  }
  TORCH_INTERNAL_ASSERT(false, "unknown operation");
}

// AmoebaNet-D's genotype (torchgpipe's genotype.py, after TensorFlow's reference implementation):
// pairs of (input state, operation); each pair's sum is a new state; the output concatenates
// the states in `concat`.
struct Genotype {
  std::vector<std::pair<int64_t, Op>> operations;
  std::vector<int64_t> concat;
};

const Genotype& normal_genotype() {
  static const Genotype genotype{{{1, Op::kConv1x1},
                                  {1, Op::kMaxPool3x3},
                                  {1, Op::kNone},
                                  {0, Op::kConv1x7_7x1},
                                  {0, Op::kConv1x1},
                                  {0, Op::kConv1x7_7x1},
                                  {2, Op::kMaxPool3x3},
                                  {2, Op::kNone},
                                  {1, Op::kAvgPool3x3},
                                  {5, Op::kConv1x1}},
                                 {0, 3, 4, 6}};
  return genotype;
}

const Genotype& reduction_genotype() {
  static const Genotype genotype{{{0, Op::kMaxPool2x2},
                                  {0, Op::kMaxPool3x3},
                                  {2, Op::kNone},
                                  {1, Op::kConv3x3},
                                  {2, Op::kConv1x7_7x1},
                                  {2, Op::kMaxPool3x3},
                                  {3, Op::kNone},
                                  {1, Op::kMaxPool2x2},
                                  {2, Op::kAvgPool3x3},
                                  {3, Op::kConv1x1}},
                                 {4, 5, 6}};
  return genotype;
}

struct StemImpl : torch::nn::Module {
  explicit StemImpl(int64_t channels)
      : conv(register_module("conv", models::conv(3, channels, 3, 2, 1))),
        bn(register_module("bn", torch::nn::BatchNorm2d(channels))) {}
  std::vector<torch::Tensor> forward(torch::Tensor input) { return {bn(conv(torch::relu(input)))}; }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(Stem);

// Takes {s1, s2} (the previous and the one before; {s} for both), returns {output, s1}.
struct CellImpl : torch::nn::Module {
  CellImpl(int64_t channels_prev_prev, int64_t channels_prev, int64_t channels, bool reduction,
           bool reduction_prev)
      : genotype_(reduction ? reduction_genotype() : normal_genotype()) {
    reduce1_ = register_module("reduce1", relu_conv_bn(channels_prev, channels));
    if (reduction_prev) {
      reduce2_ = Block(FactorizedReduce(channels_prev_prev, channels));
    } else if (channels_prev_prev != channels) {
      reduce2_ = relu_conv_bn(channels_prev_prev, channels);
    } else {
      reduce2_ = Block(torch::nn::Identity());
    }
    register_module("reduce2", reduce2_);
    for (const auto k : c10::irange(genotype_.operations.size())) {
      const auto& [index, op] = genotype_.operations[k];
      // A reduction cell halves the size where it reads the cell's inputs.
      const int64_t stride = reduction && index < 2 ? 2 : 1;
      operations_.push_back(
          register_module("operations_" + std::to_string(k), operation(op, channels, stride)));
    }
  }

  size_t concat_size() const { return genotype_.concat.size(); }

  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> input) {
    TORCH_CHECK_VALUE(input.size() == 1 || input.size() == 2,
                      "an AmoebaNet cell takes 1 or 2 tensors, but got ", input.size());
    torch::Tensor skip = input[0];
    std::vector<torch::Tensor> states{reduce1_->forward(input[0]), reduce2_->forward(input.back())};
    for (size_t k = 0; k < operations_.size(); k += 2) {
      const auto& ops = genotype_.operations;
      states.push_back(operations_[k]->forward(states[ops[k].first]) +
                       operations_[k + 1]->forward(states[ops[k + 1].first]));
    }
    std::vector<torch::Tensor> outputs;
    for (const int64_t index : genotype_.concat) outputs.push_back(states[index]);
    return {torch::cat(outputs, /*dim=*/1), std::move(skip)};
  }

  const Genotype& genotype_;
  Block reduce1_{nullptr}, reduce2_{nullptr};
  std::vector<Block> operations_;
};
TORCH_MODULE(Cell);

// Pools the last cell's output globally (torchgpipe: AvgPool2d(7) on the 7 x 7 of a 224 x 224
// input, the same there) and classifies it.
struct ClassifyImpl : torch::nn::Module {
  ClassifyImpl(int64_t channels_prev, int64_t num_classes)
      : fc(register_module("fc", torch::nn::Linear(channels_prev, num_classes))) {}
  torch::Tensor forward(std::vector<torch::Tensor> states) {
    return fc(torch::adaptive_avg_pool2d(states[0], {1, 1}).flatten(1));
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Classify);

}  // namespace

Sequential amoebanetd(const AmoebaNetOptions& options) {
  TORCH_CHECK_VALUE(options.num_layers() > 0 && options.num_layers() % 3 == 0,
                    "AmoebaNet-D needs a positive multiple of 3 normal cells (num_layers ",
                    options.num_layers(), ")");
  TORCH_CHECK_VALUE(options.num_filters() >= 8 && options.num_classes() > 0,
                    "AmoebaNet-D needs num_filters >= 8 and num_classes > 0 (num_filters ",
                    options.num_filters(), ", num_classes ", options.num_classes(), ")");
  const int64_t repeat = options.num_layers() / 3;
  int64_t channels = options.num_filters() / 4;
  int64_t channels_prev_prev = channels;
  int64_t channels_prev = channels;
  bool reduction_prev = false;

  Sequential model;
  // Each cell reads the two before it: track their widths as torchgpipe's make_cells does.
  auto add_cell = [&](const std::string& name, bool reduction) {
    Cell cell(channels_prev_prev, channels_prev, channels, reduction, reduction_prev);
    channels_prev_prev = channels_prev;
    channels_prev = channels * static_cast<int64_t>(cell->concat_size());
    reduction_prev = reduction;
    model->push_back(std::string(name), std::move(cell));
  };
  auto add_reduction = [&](const std::string& name) {
    channels *= 2;
    add_cell(name, /*reduction=*/true);
  };
  auto add_normals = [&](const std::string& group) {
    for (const auto k : c10::irange(repeat)) {
      add_cell(group + "_normal" + std::to_string(k + 1), /*reduction=*/false);
    }
  };

  model->push_back("stem1", Stem(channels));
  add_reduction("stem2");
  add_reduction("stem3");
  add_normals("cell1");
  add_reduction("cell2_reduction");
  add_normals("cell3");
  add_reduction("cell4_reduction");
  add_normals("cell5");
  model->push_back("classify", Classify(channels_prev, options.num_classes()));
  return model;
}

}  // namespace models
}  // namespace gpipe

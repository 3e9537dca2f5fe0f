#include "gpipe/batchnorm.h"

#include "gpipe/checkpoint.h"

#include <ATen/Context.h>
#include <ATen/ops/batch_norm.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/container/any.h>

#include <utility>
#include <vector>

namespace gpipe {
namespace {

void check_options(const DeferredBatchNormOptions& options) {
  TORCH_CHECK_VALUE(options.num_features() > 0,
                    "num_features must be positive (num_features: ", options.num_features(), ")");
  TORCH_CHECK_VALUE(options.chunks() > 0,
                    "number of chunks must be positive integer (chunks: ", options.chunks(), ")");
  TORCH_CHECK_VALUE(options.eps() >= 0, "eps must be non-negative (eps: ", options.eps(), ")");
}

DeferredBatchNormOptions options_of(const torch::nn::BatchNormOptions& options, int64_t chunks) {
  TORCH_CHECK_VALUE(options.track_running_stats(),
                    "a BatchNorm that does not track running statistics has none to defer");
  return DeferredBatchNormOptions(options.num_features())
      .eps(options.eps())
      .momentum(options.momentum())
      .affine(options.affine())
      .chunks(chunks);
}

// The BatchNorm{1,2,3}d that `module` is, or null.
template <typename BatchNorm>
std::shared_ptr<DeferredBatchNormImpl> defer(const std::shared_ptr<torch::nn::Module>& module,
                                             int64_t chunks) {
  auto batch_norm = std::dynamic_pointer_cast<BatchNorm>(module);
  if (!batch_norm || !batch_norm->options.track_running_stats()) return nullptr;
  return std::make_shared<DeferredBatchNormImpl>(*batch_norm, chunks);
}

std::shared_ptr<DeferredBatchNormImpl> defer_any(const std::shared_ptr<torch::nn::Module>& module,
                                                 int64_t chunks) {
  if (auto deferred = std::dynamic_pointer_cast<DeferredBatchNormImpl>(module)) {
    if (deferred->options.chunks() == chunks) return deferred;
    auto copy = std::make_shared<DeferredBatchNormImpl>(*deferred);  // shares every tensor
    copy->options.chunks(chunks);
    copy->begin_minibatch(chunks);
    return copy;
  }
  if (auto deferred = defer<torch::nn::BatchNorm1dImpl>(module, chunks)) return deferred;
  if (auto deferred = defer<torch::nn::BatchNorm2dImpl>(module, chunks)) return deferred;
  return defer<torch::nn::BatchNorm3dImpl>(module, chunks);
}

bool is_tracking_batch_norm(const std::shared_ptr<torch::nn::Module>& module) {
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module)) {
    return bn->options.track_running_stats();
  }
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module)) {
    return bn->options.track_running_stats();
  }
  if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(module)) {
    return bn->options.track_running_stats();
  }
  return false;
}

torch::nn::Sequential convert(torch::nn::Sequential& module, int64_t chunks) {
  torch::nn::Sequential converted;
  const auto names = module->named_children().keys();
  auto layer = module->begin();
  for (const auto k : c10::irange(module->size())) {
    const torch::nn::AnyModule& any = *layer++;
    const std::string& name = names[k];
    if (auto deferred = defer_any(any.ptr(), chunks)) {
      converted->push_back(name, torch::nn::AnyModule(deferred));
    } else {
      for (const auto& child : any.ptr()->named_modules(name)) {
        if (is_tracking_batch_norm(child.value())) {
          TORCH_WARN("the BatchNorm '", child.key(),
                     "' is inside another module, so it cannot be replaced by a "
                     "DeferredBatchNorm: it keeps updating its running statistics per "
                     "micro-batch");
        }
      }
      converted->push_back(name, any);
    }
  }
  return converted;
}

}  // namespace

DeferredBatchNormOptions::DeferredBatchNormOptions(int64_t num_features)
    : num_features_(num_features) {}

DeferredBatchNormImpl::DeferredBatchNormImpl(DeferredBatchNormOptions options)
    : options(std::move(options)) {
  check_options(this->options);
  expected_ = this->options.chunks();
  reset();
}

DeferredBatchNormImpl::DeferredBatchNormImpl(const torch::nn::BatchNormOptions& batch_norm,
                                             int64_t chunks, at::Tensor weight, at::Tensor bias,
                                             at::Tensor running_mean, at::Tensor running_var,
                                             at::Tensor num_batches_tracked)
    : options(options_of(batch_norm, chunks)) {
  check_options(options);
  expected_ = chunks;
  register_state(std::move(weight), std::move(bias), std::move(running_mean),
                 std::move(running_var), std::move(num_batches_tracked));
}

void DeferredBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  at::Tensor new_weight, new_bias;
  if (options.affine()) {
    new_weight = torch::ones({c});
    new_bias = torch::zeros({c});
  }
  register_state(new_weight, new_bias, torch::zeros({c}), torch::ones({c}),
                 torch::zeros({}, torch::kLong));
  clear();
}

void DeferredBatchNormImpl::register_state(at::Tensor weight, at::Tensor bias,
                                           at::Tensor running_mean, at::Tensor running_var,
                                           at::Tensor num_batches_tracked) {
  if (options.affine()) {
    this->weight = register_parameter("weight", std::move(weight));
    this->bias = register_parameter("bias", std::move(bias));
  } else {
    this->weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    this->bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  this->running_mean = register_buffer("running_mean", std::move(running_mean));
  this->running_var = register_buffer("running_var", std::move(running_var));
  this->num_batches_tracked =
      register_buffer("num_batches_tracked", std::move(num_batches_tracked));
}

at::Tensor DeferredBatchNormImpl::forward(const at::Tensor& input) {
  TORCH_CHECK_VALUE(input.dim() >= 2, "expected at least 2D input (got ", input.dim(), "D input)");
  TORCH_CHECK_VALUE(input.size(1) == options.num_features(), "expected input with ",
                    options.num_features(), " channels in dim 1 (got input of shape ",
                    input.sizes(), ")");
  const bool cudnn = at::globalContext().userEnabledCuDNN();
  if (!is_training()) {
    return at::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/false,
                          /*momentum=*/0.0, options.eps(), cudnn);
  }
  // Normalize the micro-batch by its own statistics (and train the parameters).
  at::Tensor output =
      at::batch_norm(input, weight, bias, /*running_mean=*/{},
                     /*running_var=*/{}, /*training=*/true, /*momentum=*/0.0, options.eps(), cudnn);
  if (!is_recomputing()) {  // a recomputation was tracked by the checkpointed forward
    track(input);
    if (++tracked_ >= expected_) commit();
  }
  return output;
}

void DeferredBatchNormImpl::track(const at::Tensor& input) {
  torch::NoGradGuard no_grad;
  at::Tensor x = input.detach();
  if (x.scalar_type() != at::kDouble) x = x.to(at::kFloat);
  const int64_t n = x.numel() / x.size(1);
  if (n == 0) return;

  std::vector<int64_t> dims{0};
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[1] = x.size(1);
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);

  // Deviations from the mean rounded to x's dtype, corrected to the exact mean in double.
  const at::Tensor mean = x.sum(dims, /*keepdim=*/false, at::kDouble) / static_cast<double>(n);
  const at::Tensor center = mean.to(x.scalar_type());
  const at::Tensor deviations = (x - center.view(shape)).square_();
  const at::Tensor m2 = deviations.sum(dims, /*keepdim=*/false, at::kDouble) -
                        (mean - center.to(at::kDouble)).square_() * static_cast<double>(n);

  if (count_ == 0) {
    mean_ = mean;
    m2_ = m2;
    count_ = n;
    return;
  }
  // Chan et al.'s parallel merge of (count, mean, M2).
  const double total = static_cast<double>(count_ + n);
  const at::Tensor delta = mean - mean_;
  mean_ = mean_ + delta * (static_cast<double>(n) / total);
  m2_ = m2_ + m2 + delta.square() * (static_cast<double>(count_) * static_cast<double>(n) / total);
  count_ += n;
}

void DeferredBatchNormImpl::commit() {
  torch::NoGradGuard no_grad;
  if (count_ > 0) {
    num_batches_tracked.add_(1);
    const double factor = options.momentum().has_value() ? *options.momentum()
                                                         : 1.0 / num_batches_tracked.item<double>();
    // As torch::nn::BatchNorm: the unbiased variance, averaged in double precision.
    const at::Tensor variance = m2_ / static_cast<double>(std::max<int64_t>(count_ - 1, 1));
    running_mean.copy_(running_mean.to(at::kDouble) * (1.0 - factor) +
                       mean_.to(running_mean.device()) * factor);
    running_var.copy_(running_var.to(at::kDouble) * (1.0 - factor) +
                      variance.to(running_var.device()) * factor);
  }
  clear();
  expected_ = options.chunks();
}

void DeferredBatchNormImpl::clear() {
  tracked_ = 0;
  count_ = 0;
  mean_ = at::Tensor();
  m2_ = at::Tensor();
}

void DeferredBatchNormImpl::begin_minibatch(int64_t microbatches) {
  TORCH_CHECK_VALUE(microbatches > 0,
                    "a mini-batch has at least one micro-batch (microbatches: ", microbatches, ")");
  clear();
  expected_ = microbatches;
}

void DeferredBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "gpipe::DeferredBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << (options.affine() ? "true" : "false") << ", chunks=" << options.chunks()
         << ")";
}

torch::nn::Sequential convert_deferred_batch_norm(torch::nn::Sequential module, int64_t chunks) {
  TORCH_CHECK_VALUE(chunks > 0, "number of chunks must be positive integer (chunks: ", chunks, ")");
  return convert(module, chunks);
}

std::vector<std::shared_ptr<DeferredBatchNormImpl>> deferred_batch_norms(
    const torch::nn::Module& module) {
  std::vector<std::shared_ptr<DeferredBatchNormImpl>> found;
  for (const auto& child : module.modules(/*include_self=*/false)) {
    if (auto deferred = std::dynamic_pointer_cast<DeferredBatchNormImpl>(child)) {
      found.push_back(std::move(deferred));
    }
  }
  return found;
}

}  // namespace gpipe

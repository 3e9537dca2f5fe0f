#include "gpipe/pipe.h"

#include "detail/split.h"
#include "detail/stream.h"
#include "gpipe/batchnorm.h"
#include "gpipe/skip/skippable.h"
#include "pipeline/pipeline.h"

#include <c10/util/irange.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <unordered_map>

namespace gpipe {
namespace {

// Refuses Sequentials whose layers could not be placed on distinct devices.
void verify_module(torch::nn::Sequential& module) {
  const auto children = module->children();
  for (const auto a : c10::irange(children.size())) {
    for (const auto b : c10::irange(a)) {
      TORCH_CHECK_VALUE(children[a] != children[b],
                        "module with duplicate children is not supported (children ", b, " and ", a,
                        " are the same module)");
    }
  }
  std::unordered_map<const c10::TensorImpl*, size_t> owner;
  for (const auto k : c10::irange(children.size())) {
    for (const auto& parameter : children[k]->named_parameters()) {
      auto [it, inserted] = owner.emplace(parameter.value().unsafeGetTensorImpl(), k);
      TORCH_CHECK_VALUE(inserted || it->second == k,
                        "module with duplicate parameters in distinct children is not supported "
                        "(parameter '",
                        parameter.key(), "' of child ", k, " is also in child ", it->second, ")");
    }
  }
}

}  // namespace

GPipeOptions::GPipeOptions(std::vector<int64_t> balance) : balance_(std::move(balance)) {}

GPipeImpl::GPipeImpl(torch::nn::Sequential module, GPipeOptions options)
    : options_(std::move(options)) {
  TORCH_CHECK_VALUE(options_.chunks() > 0,
                    "number of chunks must be positive integer (chunks: ", options_.chunks(), ")");
  const auto mode = options_.checkpoint();
  TORCH_CHECK_VALUE(mode == CheckpointMode::kAlways || mode == CheckpointMode::kExceptLast ||
                        mode == CheckpointMode::kNever,
                    "checkpoint is not one of 'always', 'except_last', or 'never' (got ",
                    static_cast<int>(mode), ")");
  verify_module(module);
  // Static, so checked before any forward.
  skip::verify_skippables(module);
  if (options_.deferred_batch_norm()) {
    module = convert_deferred_batch_norm(module, options_.chunks());
  }

  const auto& balance = options_.balance();
  std::vector<torch::nn::Sequential> partitions = detail::split_by_balance(module, balance);

  auto devices = options_.devices();
  if (devices.empty()) devices.assign(balance.size(), c10::Device(c10::kCPU));
  TORCH_CHECK_INDEX(devices.size() >= balance.size(),
                    "too few devices to hold given partitions (devices: ", devices.size(),
                    ", partitions: ", balance.size(), ")");
  devices.erase(devices.begin() + static_cast<std::ptrdiff_t>(balance.size()), devices.end());

  // Parameters read "partitions.1.3.weight": the partitions keep each layer's name.
  auto modules = register_module("partitions", torch::nn::ModuleList());
  for (const auto layer : c10::irange(module->size())) layers_.push_back(module->ptr(layer));
  for (const auto j : c10::irange(balance.size())) {
    torch::nn::Sequential partition = partitions[j];
    const c10::Device device = detail::normalize_device(devices[j]);
    partition->to(device);
    modules->push_back(partition);
    partitions_.push_back(partition);
    devices_.push_back(device);

    // One device thread per distinct accelerator: partitions on one device take turns on its
    // thread. CPU partitions are computed by the thread that calls forward (see
    // detail/device_thread.h).
    if (device.is_cpu()) {
      partition_threads_.push_back(nullptr);
      continue;
    }
    auto same_device = [&](const auto& thread) { return thread->device() == device; };
    auto thread = std::find_if(device_threads_.begin(), device_threads_.end(), same_device);
    if (thread == device_threads_.end()) {
      device_threads_.push_back(std::make_unique<detail::DeviceThread>(device));
      thread = std::prev(device_threads_.end());
    }
    partition_threads_.push_back(thread->get());
  }
  copy_streams_.resize(partitions_.size());
  skip_layout_ = std::make_shared<const skip::SkipLayout>(skip::inspect_skip_layout(partitions_));
  // Also those the user put in the Sequential without deferred_batch_norm(true).
  deferred_batch_norms_ = deferred_batch_norms(*this);
}

GPipeImpl::~GPipeImpl() = default;

std::shared_ptr<torch::nn::Module> GPipeImpl::ptr(size_t index) const {
  TORCH_CHECK_INDEX(index < layers_.size(), "index ", index,
                    " is out of range (size: ", layers_.size(), ")");
  return layers_[index];
}

const std::vector<c10::Stream>& GPipeImpl::copy_streams_for(size_t partition, size_t microbatches) {
  auto& streams = copy_streams_[partition];
  while (streams.size() < microbatches) streams.push_back(detail::new_stream(devices_[partition]));
  return streams;
}

Batch GPipeImpl::run(const Batch& input) {
  std::lock_guard<std::mutex> lock(forward_mutex_);
  if (partitions_.empty()) return input;  // an empty Sequential is the identity

  check(input);
  for (const auto k : c10::irange(input.size())) {
    TORCH_CHECK_VALUE(input[k].device() == devices_[0], "input tensor ", k, " is on ",
                      input[k].device(), ", but the first partition is on ", devices_[0]);
  }

  std::vector<Batch> batches = scatter(input, options_.chunks());
  const size_t m = batches.size();
  // DeferredBatchNorms commit their running statistics after this many micro-batches.
  if (is_training()) {
    for (const auto& deferred : deferred_batch_norms_) {
      deferred->begin_minibatch(static_cast<int64_t>(m));
    }
  }

  size_t checkpoint_stop = 0;
  if (is_training() && torch::autograd::GradMode::is_enabled()) {
    switch (options_.checkpoint()) {
      case CheckpointMode::kAlways:
        checkpoint_stop = m;
        break;
      case CheckpointMode::kExceptLast:
        checkpoint_stop = m - 1;
        break;
      case CheckpointMode::kNever:
        break;
    }
  }

  std::vector<std::vector<c10::Stream>> copy_streams;
  for (const auto j : c10::irange(partitions_.size())) {
    const auto& streams = copy_streams_for(j, m);
    copy_streams.emplace_back(streams.begin(), streams.begin() + m);
  }

  detail::Pipeline(batches, partitions_, devices_, std::move(copy_streams), partition_threads_,
                   checkpoint_stop, skip_layout_, options_.tracer(), steps_)
      .run();
  if (is_training()) ++steps_;
  return gather(batches);
}

void GPipeImpl::to(c10::Device, c10::ScalarType, bool) {
  TORCH_CHECK_TYPE(false,
                   "denied to move parameters and buffers, because GPipe should manage device "
                   "placement");
}

void GPipeImpl::to(c10::Device, bool) {
  TORCH_CHECK_TYPE(false,
                   "denied to move parameters and buffers, because GPipe should manage device "
                   "placement");
}

void GPipeImpl::to(c10::ScalarType dtype, bool non_blocking) {
  torch::nn::Module::to(dtype, non_blocking);
}

void GPipeImpl::pretty_print(std::ostream& stream) const {
  stream << "gpipe::GPipe(balance=" << c10::ArrayRef<int64_t>(options_.balance())
         << ", chunks=" << options_.chunks() << ", checkpoint=" << options_.checkpoint() << ")";
}

}  // namespace gpipe

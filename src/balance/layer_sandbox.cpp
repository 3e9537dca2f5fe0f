#include "balance/layer_sandbox.h"

#include "detail/stream.h"
#include "gpipe/memory.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <unordered_set>

namespace gpipe {
namespace balance {

LayerSandbox::LayerSandbox(size_t index, const std::string& name, const torch::nn::AnyModule& layer,
                           c10::Device device) {
  torch::nn::AnyModule copy;
  try {
    copy = layer.clone(device);
  } catch (const c10::Error& error) {
    if (std::string(error.what()).find("clone() has not been implemented") == std::string::npos) {
      throw;
    }
    const auto check = [&](const at::Tensor& tensor) {
      TORCH_CHECK_VALUE(
          !tensor.defined() || tensor.device() == device, "layer ", index,
          " cannot be cloned for profiling (it is no torch::nn::Cloneable) and is on ",
          tensor.device(), ", not on the profiling device ", device);
    };
    for (const auto& tensor : layer.ptr()->parameters()) check(tensor);
    for (const auto& tensor : layer.ptr()->buffers()) check(tensor);
    copy = layer;
    in_place_.emplace(layer.ptr());
  }
  copy.ptr()->train(true);
  sequential_->push_back(name, std::move(copy));
}

void detach(Batch& batch) {
  for (const auto k : c10::irange(batch.size())) {
    const bool requires_grad = batch[k].requires_grad();
    batch[k] = batch[k].detach().requires_grad_(requires_grad);
  }
}

Batch to_device(const Batch& sample, c10::Device device) {
  Batch batch = sample;
  for (const auto k : c10::irange(batch.size())) {
    const bool requires_grad = batch[k].requires_grad();
    batch[k] = batch[k].detach().to(device).requires_grad_(requires_grad);
  }
  return batch;
}

void check_no_gradients(torch::nn::Sequential& module) {
  for (const auto& parameter : module->named_parameters()) {
    TORCH_CHECK_VALUE(!parameter.value().grad().defined(), "some parameter already has gradient ('",
                      parameter.key(),
                      "'): profiling would accumulate into it; zero_grad(/*set_to_none=*/true) it");
  }
}

void synchronize(c10::Device device) {
  if (device.is_cpu()) return;
  gpipe::detail::current_stream(device).synchronize();
}

c10::Device memory_profiling_device(const Batch& sample) {
  const c10::Device device = gpipe::detail::normalize_device(sample[0].device());
  if (device.is_cuda()) return device;
  memory::install_tracking_cpu_allocator();
  return c10::Device(c10::kCPU);
}

int64_t parameter_bytes(torch::nn::Sequential& module) {
  return storage_bytes(module->parameters());
}

int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const void*> storages;
  int64_t bytes = 0;
  for (const auto& tensor : tensors) {
    if (!tensor.defined() || !tensor.has_storage()) continue;
    const auto& storage = tensor.storage();
    if (storages.insert(storage.unsafeGetStorageImpl()).second) {
      bytes += static_cast<int64_t>(storage.nbytes());
    }
  }
  return bytes;
}

}  // namespace balance
}  // namespace gpipe

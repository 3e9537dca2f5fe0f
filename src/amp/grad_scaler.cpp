#include "gpipe/amp/grad_scaler.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <string>
#include <unordered_map>

namespace gpipe {
namespace amp {

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  TORCH_CHECK_VALUE(options_.init_scale() > 0 && std::isfinite(options_.init_scale()),
                    "init_scale must be positive and finite, but got ", options_.init_scale());
  TORCH_CHECK_VALUE(options_.growth_factor() > 1 && std::isfinite(options_.growth_factor()),
                    "growth_factor must be more than 1, but got ", options_.growth_factor());
  TORCH_CHECK_VALUE(options_.backoff_factor() > 0 && options_.backoff_factor() < 1,
                    "backoff_factor must be in (0, 1), but got ", options_.backoff_factor());
  TORCH_CHECK_VALUE(options_.growth_interval() > 0, "growth_interval must be positive, but got ",
                    options_.growth_interval());
  scale_ = static_cast<float>(options_.init_scale());
}

double GradScaler::scale() const { return options_.enabled() ? scale_ : 1.0; }

at::Tensor GradScaler::scale(const at::Tensor& loss) const {
  return options_.enabled() ? loss * scale() : loss;
}

void GradScaler::unscale(const std::vector<at::Tensor>& parameters,
                         const std::function<bool(bool)>& any_rank) {
  if (!options_.enabled()) return;
  // As torch.amp.GradScaler: the reciprocal in double, rounded to float32.
  const double inverse = static_cast<float>(1.0 / static_cast<double>(scale_));
  std::unordered_map<c10::Device, at::Tensor> nonfinite;  // per device, so it syncs once per device
  for (const auto& p : parameters) {
    at::Tensor grad = p.grad();
    if (!grad.defined()) continue;
    TORCH_CHECK_VALUE(grad.scalar_type() != at::kHalf,
                      "cannot unscale float16 gradients: keep the parameters in float32 and let "
                      "autocast compute in float16");
    grad.mul_(inverse);
    at::Tensor bad = at::isfinite(grad).logical_not().any();
    auto [it, added] = nonfinite.emplace(grad.device(), bad);
    if (!added) it->second = it->second.logical_or(bad);
  }
  bool found = false;
  for (const auto& entry : nonfinite) found = found || entry.second.item<bool>();
  if (any_rank) found = any_rank(found);
  found_inf_ = found_inf_ || found;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (options_.enabled() && found_inf_) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  // torch._amp_update_scale_.
  if (found_inf_) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor());
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval()) {
    const auto grown = static_cast<float>(scale_ * options_.growth_factor());
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  found_inf_ = false;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  const auto value = [](double x) { return at::scalar_tensor(x, at::kDouble); };
  archive.write("scale", value(scale_), /*is_buffer=*/true);
  archive.write("growth_tracker", at::scalar_tensor(growth_tracker_, at::kLong), true);
  archive.write("growth_factor", value(options_.growth_factor()), true);
  archive.write("backoff_factor", value(options_.backoff_factor()), true);
  archive.write("growth_interval", at::scalar_tensor(options_.growth_interval(), at::kLong), true);
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  const auto read = [&](const char* key) {
    at::Tensor tensor;
    archive.read(key, tensor, /*is_buffer=*/true);
    return tensor;
  };
  const auto same = [&](const char* key, double expected) {
    const double saved = read(key).item<double>();
    TORCH_CHECK_VALUE(saved == expected, "the saved grad scaler has ", key, " ", saved,
                      ", this one ", expected);
  };
  same("growth_factor", options_.growth_factor());
  same("backoff_factor", options_.backoff_factor());
  same("growth_interval", static_cast<double>(options_.growth_interval()));
  scale_ = static_cast<float>(read("scale").item<double>());
  growth_tracker_ = read("growth_tracker").item<int64_t>();
  found_inf_ = false;
}

}  // namespace amp
}  // namespace gpipe

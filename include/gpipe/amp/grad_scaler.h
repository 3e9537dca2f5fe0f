// GradScaler: loss scaling for float16 training, as torch.amp.GradScaler, for pipelines on
// threads and across ranks (LibTorch has none in C++, and PyTorch's cannot see a pipeline's other
// ranks).
//
// float16 gradients underflow; scaling the loss by S scales every gradient by S and keeps them in
// range. Given to an engine (the grad_scaler option, schedule/options.h), the scaler makes each
// step:
//   1. start every micro-batch's backward from S instead of 1 (loss * S);
//   2. divide the step's gradients by S once they are complete on this rank (tied copies summed,
//      replicas averaged), and look for inf or NaN in them;
//   3. agree with every rank of the pipeline, and so of every replica, whether any found one.
// The loss step() returns is not scaled. Then, in the training loop:
//   - step(optimizer) runs optimizer.step() unless some rank overflowed since the last update():
//     every rank skips the same steps, so their parameters stay consistent;
//   - update() backs the scale off (x backoff_factor) after an overflow, and grows it
//     (x growth_factor) after growth_interval steps in a row without one.
// Gradients already there when a step starts (accumulated from earlier steps) are set aside and
// added back after it, so accumulating several steps before an optimizer step works.
//
// A training loop of one's own (a plain model) uses scale(loss), unscale(parameters), step() and
// update() as with PyTorch's.
//
// Example:
//   auto scaler = std::make_shared<gpipe::amp::GradScaler>();
//   gpipe::schedule::PipelineSchedule pipe(model, balance, loss,
//       gpipe::schedule::PipelineScheduleOptions(8).grad_scaler(scaler));
//   for (...) {
//     optimizer.zero_grad();
//     {
//       gpipe::amp::Autocast autocast(torch::kCUDA, torch::kHalf);
//       pipe.step(input, target);
//     }
//     pipe.clip_grad_norm(1.0);  // the gradients are unscaled already
//     scaler->step(optimizer);   // skipped on every rank if any overflowed
//     scaler->update();
//   }
//
// Thread safety: one thread at a time; an engine uses it during step() only.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace gpipe {
namespace amp {

/// Options for GradScaler: those of torch.amp.GradScaler, with its defaults.
struct GradScalerOptions {
  /// The first scale. Positive and finite. Default: 65536 (2^16).
  TORCH_ARG(double, init_scale) = 65536.0;
  /// The scale's factor after growth_interval steps without overflow. More than 1. Default: 2.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// The scale's factor after an overflow. In (0, 1). Default: 0.5.
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Steps in a row without overflow before the scale grows. Positive. Default: 2000.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// Off: scale() is 1, nothing is unscaled or skipped. Default: true.
  TORCH_ARG(bool, enabled) = true;
};

/// Dynamic loss scaling.
class GradScaler {
 public:
  /// Throws c10::ValueError for an option out of its range.
  explicit GradScaler(GradScalerOptions options = {});

  /// The scale of this step's losses: 1 when disabled.
  double scale() const;
  /// `loss` times scale(), for a loop of one's own.
  at::Tensor scale(const at::Tensor& loss) const;

  /// Divides the gradients of `parameters` by scale() and records whether any is inf or NaN
  /// (found_inf()). `any_rank`, where given, is called once with this process's verdict and
  /// returns whether any rank found one (the engines pass their ranks' agreement). Throws
  /// c10::ValueError for a float16 gradient, which unscaling would round (train float32
  /// parameters under autocast).
  void unscale(const std::vector<at::Tensor>& parameters,
               const std::function<bool(bool)>& any_rank = nullptr);

  /// True if some rank's gradients held inf or NaN since the last update().
  bool found_inf() const { return found_inf_; }

  /// optimizer.step() unless found_inf(); returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);

  /// Backs off or grows the scale (see the top of this file) and forgets found_inf().
  void update();

  /// Steps in a row without overflow since the scale last changed.
  int64_t growth_tracker() const { return growth_tracker_; }
  const GradScalerOptions& options() const { return options_; }

  /// The scale and the growth tracker, e.g. in a training snapshot; load() checks that the
  /// saved options equal these, and throws c10::ValueError naming the first that differs.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  GradScalerOptions options_;
  float scale_;  // float32, as torch.amp.GradScaler keeps it
  int64_t growth_tracker_ = 0;
  bool found_inf_ = false;
};

}  // namespace amp
}  // namespace gpipe

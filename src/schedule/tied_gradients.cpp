#include "schedule/tied_gradients.h"

#include <c10/util/irange.h>

#include <utility>

namespace gpipe {
namespace detail {
namespace {

// The pipeline and worker the calling thread computes for, if any.
thread_local const void* current_tied = nullptr;
thread_local int64_t current_worker = -1;

}  // namespace

TiedGradients::TiedGradients(std::vector<at::Tensor> tied, int64_t num_workers)
    : tied_(std::move(tied)), sums_(num_workers, std::vector<at::Tensor>(tied_.size())) {
  for (const auto k : c10::irange(tied_.size())) {
    hooks_.push_back(
        tied_[k].register_hook([this, k](const at::Tensor& grad) { return take(k, grad); }));
  }
}

TiedGradients::~TiedGradients() {
  for (const auto k : c10::irange(tied_.size())) tied_[k].remove_hook(hooks_[k]);
}

TiedGradients::UseWorker::UseWorker(TiedGradients& tied, int64_t worker)
    : outer_tied_(std::exchange(current_tied, &tied)),
      outer_worker_(std::exchange(current_worker, worker)) {}

TiedGradients::UseWorker::~UseWorker() {
  current_tied = outer_tied_;
  current_worker = outer_worker_;
}

at::Tensor TiedGradients::take(size_t k, const at::Tensor& grad) {
  if (current_tied != this) return grad;  // not one of this pipeline's workers
  at::Tensor& sum = sums_[current_worker][k];
  // As AccumulateGrad adds.
  sum = sum.defined() ? sum.add_(grad) : grad.clone();
  // The parameter's grad receives nothing now (zeros, without allocating).
  return at::zeros({}, grad.options()).expand(grad.sizes());
}

void TiedGradients::finish() {
  for (auto& sums : sums_) {
    for (const auto k : c10::irange(tied_.size())) {
      if (!sums[k].defined()) continue;
      at::Tensor& grad = tied_[k].mutable_grad();
      grad = grad.defined() ? grad.add_(sums[k]) : std::move(sums[k]);
      sums[k] = at::Tensor();
    }
  }
}

void TiedGradients::discard() {
  for (auto& sums : sums_) {
    for (auto& sum : sums) sum = at::Tensor();
  }
}

}  // namespace detail
}  // namespace gpipe

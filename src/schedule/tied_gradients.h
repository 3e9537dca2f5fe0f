// The gradients of tied parameters on worker threads, added up in one order every run.
//
// Stages on different workers give a tied parameter their parts of its gradient at the same
// time; added straight into its grad, they would meet in whatever order the threads reach it.
// Instead, a hook on the parameter sees which worker's thread computes and adds the part into
// that worker's own sum (in the order its schedule runs), and finish() adds the workers' sums in
// worker order: the order of PipelineStage, whose ranks add their own parts and then sum over
// the ranks, so threads and ranks give the same bits for a tie between two workers.
//
// On CUDA the autograd engine differentiates on its own device threads, which are no worker's:
// there the parts go straight into the grad, in the order they come.
//
// Internal to the engines. Thread safety: worker w touches only its own sums; finish() runs once
// the workers are done.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace gpipe {
namespace detail {

class TiedGradients {
 public:
  /// Hooks `tied` (the parameters several stages share) for `num_workers` workers.
  TiedGradients(std::vector<at::Tensor> tied, int64_t num_workers);
  /// Removes the hooks.
  ~TiedGradients();
  TiedGradients(const TiedGradients&) = delete;
  TiedGradients& operator=(const TiedGradients&) = delete;

  /// For a scope, the calling thread is worker `worker` of this pipeline.
  class UseWorker {
   public:
    UseWorker(TiedGradients& tied, int64_t worker);
    ~UseWorker();

   private:
    const void* outer_tied_;
    int64_t outer_worker_;
  };

  /// Adds each worker's sums to the tied parameters' gradients, worker by worker, and starts
  /// afresh.
  void finish();

  /// Drops the workers' sums (after a failed step).
  void discard();

 private:
  // Where the hook of parameter k puts `grad`; returns what the parameter's grad receives.
  at::Tensor take(size_t k, const at::Tensor& grad);

  std::vector<at::Tensor> tied_;
  std::vector<unsigned> hooks_;
  std::vector<std::vector<at::Tensor>> sums_;  // [worker][parameter]
};

}  // namespace detail
}  // namespace gpipe

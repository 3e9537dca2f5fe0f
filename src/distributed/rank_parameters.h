// The parameters of a pipeline across its ranks: which rank holds which, the ones tied across
// ranks kept equal, and what the ranks compute together over them.
//
// Every rank builds the whole model, so every rank knows every parameter and the stages that use
// it (schedule/pipeline_parameters.h), and so the ranks that hold it; the first of them owns it.
// A parameter tied across ranks (an embedding on the first rank reused as the output projection
// on the last) has a copy on each of its ranks: after each step their gradients are summed among
// those ranks only, over a Gloo group of theirs (as Megatron sums its tied embedding's), so every
// copy gets the plain model's gradient and, stepped alike, the copies stay equal.
//
// Over a Gloo group of the pipeline's ranks: the gradient norm of the whole model (each
// parameter's number from its owner, gradient_norm.h), and whether any rank's gradients
// overflowed. With replicas, each replica has its own groups; its gradients were averaged with
// the other replicas' first, so every replica reaches the same verdicts.
//
// Thread safety: used by the rank's one worker thread.
#pragma once

#include "gpipe/distributed/rendezvous.h"
#include "schedule/pipeline_parameters.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gpipe {
namespace distributed {

class RankParameters {
 public:
  /// `parameters`: every parameter of the whole model, with its stages; `rank_of_stage[s]`: the
  /// rank (in `world`) that runs stage s in this rank's replica. Makes the groups, named under
  /// `name` in the store (the same on every rank). Every rank of the job constructs it, in the
  /// same order.
  RankParameters(const ProcessGroup& world, std::vector<detail::PipelineParameter> parameters,
                 std::vector<int64_t> rank_of_stage, const std::string& name,
                 std::chrono::milliseconds timeout);

  /// This rank's parameters, each once, in the model's order.
  const std::vector<at::Tensor>& local() const { return local_; }

  /// True if some parameter of this rank is tied across ranks.
  bool has_tied() const { return !ties_.empty(); }
  /// This rank's parameters tied across ranks, each once.
  std::vector<at::Tensor> tied() const;
  /// True if any parameter of the model is tied across ranks (the same on every rank).
  bool model_has_ties_across_ranks() const { return model_has_ties_across_ranks_; }

  /// Compares the copies of every parameter tied across ranks among its ranks: "" where they are
  /// equal, else a message naming the first that differs, its stages and ranks. Collective among
  /// the ranks of each tie.
  std::string differing_tied_copies();

  /// The gradients of the parameters tied across ranks, summed among the ranks of each tie in
  /// three calls, so that the messages cross the link while the pipeline still computes: the
  /// receives of the other ranks' gradients posted (before the step's actions run), this rank's
  /// gradients sent (as soon as its actions are done: the last rank's head finishes long before
  /// the first rank's embedding), then the sum. Each rank sends its whole gradients to each other
  /// rank of the tie and adds them up in rank order, in double precision as an all-reduce would:
  /// every copy gets the same sum, after one message's latency rather than an all-reduce's
  /// round trips. An undefined gradient counts as zeros. Collective among the ranks of each tie;
  /// the three calls come in this order, once a step.
  void post_tied_receives();
  void send_tied_gradients();
  void sum_tied_gradients();

  /// The pipeline's gradient norm, clipped as torch::nn::utils::clip_grad_norm_ clips the plain
  /// model's (gradient_norm.h). Collective among the pipeline's ranks.
  double clip_grad_norm(double max_norm, double norm_type, bool error_if_nonfinite);

  /// True on every rank of the pipeline if `flag` is on any. Collective likewise.
  bool any(bool flag);

 private:
  // Ranks that share tied parameters, the group among them, and their parameters.
  struct Tie {
    std::vector<int64_t> ranks;
    c10::intrusive_ptr<Backend> group;
    std::vector<size_t> parameters;  // indices into parameters_
    int64_t numel = 0;               // of its parameters together
    // This step's exchange (post_tied_receives .. sum_tied_gradients): each rank's gradients,
    // flat in double, in the order of `ranks` (this rank's own once sent), and the messages
    // under way.
    std::vector<at::Tensor> gradients;
    std::vector<c10::intrusive_ptr<c10d::Work>> receives, sends;

    std::string name() const;  // "the sum of tied gradients among ranks 0, 3"
  };

  // Waits for `work`: a failure names `tie`'s exchange.
  static void wait(const c10::intrusive_ptr<c10d::Work>& work, const Tie& tie);

  int64_t rank_;
  std::vector<detail::PipelineParameter> parameters_;
  std::vector<int64_t> owners_;  // the rank that owns each parameter
  std::vector<at::Tensor> local_;
  std::vector<Tie> ties_;  // those this rank is in
  bool model_has_ties_across_ranks_ = false;
  c10::intrusive_ptr<Backend> pipeline_;  // null for a pipeline of one rank
  std::string name_;
};

}  // namespace distributed
}  // namespace gpipe

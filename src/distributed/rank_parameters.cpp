#include "distributed/rank_parameters.h"

#include "detail/message_of.h"
#include "distributed/all_reduce.h"
#include "schedule/gradient_norm.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <utility>

namespace gpipe {
namespace distributed {
namespace {

bool contains(const std::vector<int64_t>& values, int64_t value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

}  // namespace

RankParameters::RankParameters(const ProcessGroup& world,
                               std::vector<detail::PipelineParameter> parameters,
                               std::vector<int64_t> rank_of_stage, const std::string& name,
                               std::chrono::milliseconds timeout)
    : rank_(world.rank()), parameters_(std::move(parameters)), name_(name) {
  // Every rank walks every parameter in the same order, so the groups are made in one order
  // everywhere: a rank waits for a group's other ranks only after the groups before it.
  std::vector<std::vector<int64_t>> tied_sets;
  for (const auto k : c10::irange(parameters_.size())) {
    const auto& p = parameters_[k];
    std::vector<int64_t> ranks;
    for (const int64_t s : p.stages) {
      if (!contains(ranks, rank_of_stage.at(s))) ranks.push_back(rank_of_stage.at(s));
    }
    owners_.push_back(ranks[0]);
    if (contains(ranks, rank_)) local_.push_back(p.tensor);
    if (ranks.size() < 2) continue;
    model_has_ties_across_ranks_ = true;
    std::sort(ranks.begin(), ranks.end());
    if (!contains(ranks, rank_)) continue;
    auto tie =
        std::find_if(ties_.begin(), ties_.end(), [&](const Tie& t) { return t.ranks == ranks; });
    if (tie == ties_.end()) {
      ties_.emplace_back();
      tie = ties_.end() - 1;
      tie->ranks = ranks;
      tie->group = new_group(world, ranks, name + "/tied_ranks_" + c10::Join("_", ranks), timeout);
    }
    tie->parameters.push_back(k);
    tie->numel += p.tensor.numel();
  }
  std::vector<int64_t> pipeline = rank_of_stage;
  std::sort(pipeline.begin(), pipeline.end());
  pipeline.erase(std::unique(pipeline.begin(), pipeline.end()), pipeline.end());
  if (pipeline.size() > 1) pipeline_ = new_group(world, pipeline, name + "/pipeline", timeout);
}

std::vector<at::Tensor> RankParameters::tied() const {
  std::vector<at::Tensor> tensors;
  for (const auto& tie : ties_) {
    for (const size_t k : tie.parameters) tensors.push_back(parameters_[k].tensor);
  }
  return tensors;
}

std::string RankParameters::differing_tied_copies() {
  for (const Tie& tie : ties_) {
    std::vector<at::Tensor> values;
    for (const size_t k : tie.parameters) {
      values.push_back(parameters_[k].tensor.detach().reshape({-1}).to(at::kDouble).cpu());
    }
    const at::Tensor flat = at::cat(values);
    // One all-reduce gives the largest of each value and, negated, the smallest.
    const at::Tensor extremes = at::cat({flat, -flat});
    detail::all_reduce(*tie.group, {extremes}, c10d::ReduceOp::MAX, 1.0,
                       "comparing tied parameters among ranks " + c10::Join(", ", tie.ranks));
    const int64_t n = flat.numel();
    const at::Tensor spread = extremes.narrow(0, 0, n) + extremes.narrow(0, n, n);
    int64_t at = 0;
    for (const size_t k : tie.parameters) {
      const auto& p = parameters_[k];
      const int64_t size = p.tensor.numel();
      const double differs = spread.narrow(0, at, size).max().item<double>();
      at += size;
      if (differs == 0) continue;
      return c10::str("parameter '", p.name, "' is tied across stages ", c10::Join(", ", p.stages),
                      " on ranks ", c10::Join(", ", tie.ranks),
                      ", but its copies there differ (by up to ", differs,
                      "): every rank must build the same model (e.g. from one seed)");
    }
  }
  return "";
}

std::string RankParameters::Tie::name() const {
  return "the sum of tied gradients among ranks " + c10::Join(", ", ranks);
}

void RankParameters::wait(const c10::intrusive_ptr<c10d::Work>& work, const Tie& tie) {
  try {
    work->wait();
  } catch (const std::exception& error) {
    TORCH_CHECK(false, tie.name(), " failed: ", detail::message_of(error));
  }
}

void RankParameters::post_tied_receives() {
  for (Tie& tie : ties_) {
    TORCH_CHECK(tie.receives.empty() && tie.sends.empty(), tie.name(),
                ": the last step's exchange is unfinished");
    tie.gradients.assign(tie.ranks.size(), at::Tensor());
    for (const auto r : c10::irange(tie.ranks.size())) {
      if (tie.ranks[r] == rank_) continue;
      tie.gradients[r] = at::empty({tie.numel}, at::kDouble);
      std::vector<at::Tensor> buffer{tie.gradients[r]};
      tie.receives.push_back(tie.group->recv(buffer, static_cast<int>(r), /*tag=*/0));
    }
  }
}

void RankParameters::send_tied_gradients() {
  for (Tie& tie : ties_) {
    TORCH_INTERNAL_ASSERT(tie.gradients.size() == tie.ranks.size() && tie.sends.empty(), tie.name(),
                          ": post_tied_receives() comes first, once a step");
    std::vector<at::Tensor> grads;
    for (const size_t k : tie.parameters) {
      const at::Tensor& p = parameters_[k].tensor;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad().detach().reshape({-1}).to(at::kDouble).cpu());
    }
    const auto self = std::find(tie.ranks.begin(), tie.ranks.end(), rank_) - tie.ranks.begin();
    tie.gradients[self] = at::cat(grads);
    for (const auto r : c10::irange(tie.ranks.size())) {
      if (static_cast<int64_t>(r) == self) continue;
      std::vector<at::Tensor> message{tie.gradients[self]};
      tie.sends.push_back(tie.group->send(message, static_cast<int>(r), /*tag=*/0));
    }
  }
}

void RankParameters::sum_tied_gradients() {
  for (Tie& tie : ties_) {
    TORCH_INTERNAL_ASSERT(tie.sends.size() + 1 == tie.ranks.size(), tie.name(),
                          ": send_tied_gradients() comes first");
    for (const auto& work : tie.receives) wait(work, tie);
    for (const auto& work : tie.sends) wait(work, tie);
    tie.receives.clear();
    tie.sends.clear();
    at::Tensor sum = tie.gradients[0].clone();
    for (const auto r : c10::irange(size_t{1}, tie.ranks.size())) sum.add_(tie.gradients[r]);
    tie.gradients.clear();
    int64_t at = 0;
    for (const size_t k : tie.parameters) {
      const at::Tensor grad = parameters_[k].tensor.grad().detach();
      const int64_t n = grad.numel();
      grad.copy_(sum.narrow(0, at, n).view(grad.sizes()));
      at += n;
    }
  }
}

double RankParameters::clip_grad_norm(double max_norm, double norm_type, bool error_if_nonfinite) {
  // Each parameter's number where its owner put it, and 1 where it has a gradient; zeros
  // elsewhere, so that the sum over the ranks is exact.
  const int64_t N = static_cast<int64_t>(parameters_.size());
  std::vector<int64_t> owned;
  std::vector<at::Tensor> norms;
  for (const auto k : c10::irange(N)) {
    const at::Tensor& grad = parameters_[k].tensor.grad();
    if (owners_[k] != rank_ || !grad.defined()) continue;
    owned.push_back(k);
    norms.push_back(detail::gradient_norm(grad, norm_type).to(at::kDouble).cpu());
  }
  at::Tensor gathered = at::zeros({2 * N}, at::kDouble);
  if (!owned.empty()) {
    const at::Tensor where = at::tensor(owned, at::kLong);
    gathered.index_copy_(0, where, at::stack(norms));
    gathered.index_fill_(0, where + N, 1.0);
  }
  if (pipeline_) {
    detail::all_reduce(*pipeline_, {gathered}, c10d::ReduceOp::SUM, 1.0,
                       "the gradient norm's all-reduce among the pipeline's ranks");
  }
  const auto values = gathered.accessor<double, 1>();
  std::vector<at::Tensor> with_grad;  // in the model's order, each in its parameter's dtype
  for (const auto k : c10::irange(N)) {
    if (values[N + k] == 0) continue;
    with_grad.push_back(at::scalar_tensor(values[k], parameters_[k].tensor.scalar_type()));
  }
  if (with_grad.empty()) return 0.0;
  std::vector<at::Tensor> grads;
  for (const auto& p : local_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return detail::clip_gradients(grads, detail::total_norm(with_grad, norm_type), max_norm,
                                norm_type, error_if_nonfinite);
}

bool RankParameters::any(bool flag) {
  if (!pipeline_) return flag;
  at::Tensor value = at::scalar_tensor(flag ? 1.0 : 0.0, at::kDouble).reshape({1});
  detail::all_reduce(*pipeline_, {value}, c10d::ReduceOp::MAX, 1.0,
                     "the overflow check's all-reduce among the pipeline's ranks");
  return value.item<double>() > 0;
}

}  // namespace distributed
}  // namespace gpipe

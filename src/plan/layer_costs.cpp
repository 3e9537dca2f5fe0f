#include "plan/layer_costs.h"

#include "balance/layer_sandbox.h"
#include "gpipe/memory.h"
#include "gpipe/skip/tracker.h"
#include "schedule/scaled_loss.h"
#include "schedule/split_backward.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace gpipe {
namespace plan_detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point begin, Clock::time_point end) {
  return std::chrono::duration<double>(end - begin).count();
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

int64_t bytes_of(const Batch& batch) {
  int64_t bytes = 0;
  for (const auto& tensor : batch.tensors()) {
    if (tensor.defined()) bytes += static_cast<int64_t>(tensor.nbytes());
  }
  return bytes;
}

std::vector<at::Tensor> carrying_gradients(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& tensor : tensors) {
    if (tensor.defined() && tensor.requires_grad()) out.push_back(tensor);
  }
  return out;
}

// What the input half of the backward of `output` towards `leaves` leaves for the weight half:
// the gradients it captures, less what only it needed. The weight half then frees the graph.
int64_t weight_pending_bytes(const Batch& output, const std::vector<at::Tensor>& leaves,
                             c10::Device device) {
  const std::vector<at::Tensor> outputs = carrying_gradients(output.tensors());
  if (outputs.empty()) return 0;
  schedule::detail::WeightRoots roots;
  balance::synchronize(device);
  const int64_t held_before = memory::current_bytes(device);
  // Gradients of their own, as a stage receives them: the weight half may keep them.
  std::vector<at::Tensor> received;
  for (const auto& y : outputs) received.push_back(torch::ones_like(y));
  std::vector<at::Tensor> upstream =
      schedule::detail::backward_input(outputs, received, leaves, &roots);
  upstream.clear();
  received.clear();
  balance::synchronize(device);
  const int64_t pending = memory::current_bytes(device) - held_before;
  schedule::detail::backward_weight(roots);
  return pending;
}

}  // namespace

std::vector<LayerCosts> profile_layer_costs(torch::nn::Sequential model, const Batch& microbatch,
                                            int64_t repetitions, Batch* last_output) {
  TORCH_CHECK_VALUE(repetitions >= 1, "repetitions must be positive (repetitions: ", repetitions,
                    ")");
  TORCH_CHECK_VALUE(microbatch.size() > 0, "the sample has no tensor");
  balance::check_no_gradients(model);
  const c10::Device device = balance::memory_profiling_device(microbatch);
  const Batch input = balance::to_device(microbatch, device);
  const auto names = model->named_children().keys();
  torch::AutoGradMode grad_mode(true);

  const size_t layers = model->size();
  std::vector<LayerCosts> costs(layers);
  std::vector<std::vector<double>> forward(layers), backward(layers), backward_input(layers),
      backward_weight(layers);
  for (int64_t pass = 0; pass < repetitions; ++pass) {
    Batch batch = input;
    std::map<skip::SkipKey, at::Tensor> stashed;  // by the layers so far, not popped yet
    std::map<skip::SkipKey, int64_t> stashed_by;  // the layer that stashed each
    auto layer = model->begin();
    for (const auto k : c10::irange(layers)) {
      balance::LayerSandbox sandbox(k, names[k], *layer++, device);
      balance::detach(batch);
      // A stage receives its input as a tensor that carries gradients, the first one excepted.
      if (k > 0) {
        for (const auto j : c10::irange(batch.size())) {
          if (batch[j].is_floating_point()) batch[j].requires_grad_(true);
        }
      }
      const std::vector<at::Tensor> inputs = carrying_gradients(batch.tensors());
      costs[k].input_bytes = bytes_of(batch);
      costs[k].parameter_bytes = balance::parameter_bytes(sandbox.sequential());

      // Skips: each forward pops from and stashes into a tracker of its own, seeded with what
      // the layers before stashed, cut from their graphs as a stage receives them.
      const auto call = [&](const Batch& x, const std::shared_ptr<skip::SkipTracker>& tracker) {
        skip::UseSkipTracker use(tracker);
        return x.call(sandbox.sequential(), "layer " + std::to_string(k));
      };
      const auto seeded = [&] {
        auto tracker = std::make_shared<skip::SkipTracker>();
        for (const auto& [key, tensor] : stashed) {
          at::Tensor leaf = tensor.defined() ? tensor.detach() : tensor;
          if (leaf.defined() && leaf.is_floating_point()) leaf.requires_grad_(true);
          tracker->save(key, leaf);
        }
        return tracker;
      };
      const std::shared_ptr<skip::SkipTracker> tracker = seeded();
      const std::map<skip::SkipKey, at::Tensor> seeds = tracker->tensors();
      balance::synchronize(device);
      const int64_t before = memory::current_bytes(device);
      memory::reset_peak(device);
      auto tick = Clock::now();
      Batch output = call(batch, tracker);
      balance::synchronize(device);
      forward[k].push_back(seconds_between(tick, Clock::now()));
      // What the layer popped that carries gradients: a stage's input half computes their
      // gradients, as of its input, and sends them back to the stage that stashed them.
      std::vector<skip::SkipKey> popped;
      for (const auto& [key, leaf] : seeds) {
        if (leaf.defined() && leaf.requires_grad() && tracker->tensors().count(key) == 0) {
          popped.push_back(key);
        }
      }
      if (pass == 0) {
        costs[k].activation_bytes = std::max<int64_t>(memory::current_bytes(device) - before, 0);
        costs[k].forward_transient_bytes =
            std::max<int64_t>(memory::peak_bytes(device) - before - costs[k].activation_bytes, 0);
        costs[k].output_bytes = bytes_of(output);
        for (const auto& key : popped) {
          costs[k].popped.push_back(
              {stashed_by.at(key), static_cast<int64_t>(seeds.at(key).nbytes())});
        }
        // Within a stage, the layer before lets go of this layer's input unless this layer
        // saved it, and a split backward's input half lets go of it unless the weight half needs
        // it: forward a copy, let go of it, and see what stays, then what stays past the input
        // half. The copy is made by an addition, as a layer's output is, so that no leaf's
        // AccumulateGrad keeps it; the addition's other operand is the input half's leaf. The
        // weight half allocates the parameters' gradients, which a step finds allocated.
        // An input that a layer before stashed stays, held for the layer that pops it: the
        // copies in held_by_skips stay until the measurement ends.
        std::optional<Batch> copy = batch;
        std::vector<at::Tensor> leaves, held_by_skips;
        for (const auto j : c10::irange(batch.size())) {
          const at::Tensor x = batch[j].detach();
          if (batch[j].requires_grad()) {
            leaves.push_back(torch::zeros({}, x.options().requires_grad(true)));
            (*copy)[j] = x + leaves.back();
          } else {
            (*copy)[j] = x.clone();
          }
          for (const auto& [key, tensor] : stashed) {
            if (tensor.defined() && tensor.is_alias_of(batch[j])) {
              held_by_skips.push_back((*copy)[j]);
              break;
            }
          }
        }
        balance::synchronize(device);
        const int64_t with_copy = memory::current_bytes(device);
        const std::shared_ptr<skip::SkipTracker> chained_tracker = seeded();
        for (const auto& key : popped) leaves.push_back(chained_tracker->tensors().at(key));
        const Batch kept = call(*copy, chained_tracker);
        copy.reset();
        costs[k].chained_activation_bytes = memory::current_bytes(device) - with_copy;
        costs[k].chained_weight_pending_bytes = weight_pending_bytes(kept, leaves, device);
      }

      const std::vector<at::Tensor> outputs = carrying_gradients(output.tensors());
      std::vector<at::Tensor> gradients;
      for (const auto& y : outputs) gradients.push_back(y.detach());
      // The whole backward, as the schedules that do not split it run it (Stage::backward).
      if (!outputs.empty()) {
        const int64_t held_before = memory::current_bytes(device);
        memory::reset_peak(device);
        tick = Clock::now();
        torch::autograd::backward(outputs, gradients);
        balance::synchronize(device);
        backward[k].push_back(seconds_between(tick, Clock::now()));
        if (pass == 0) {
          costs[k].backward_transient_bytes =
              std::max<int64_t>(memory::peak_bytes(device) - held_before, 0);
        }
      }
      // Forward again and split the backward as the zero-bubble schedules do
      // (schedule/split_backward.h): what the input half leaves for the weight half is held
      // until it runs.
      const std::shared_ptr<skip::SkipTracker> again_tracker = seeded();
      std::vector<at::Tensor> leaves = inputs;  // and what it pops, as the stage's input half
      for (const auto& key : popped) leaves.push_back(again_tracker->tensors().at(key));
      const Batch again = call(batch, again_tracker);
      for (const auto& [key, tensor] : tracker->tensors()) {
        if (stashed.count(key) == 0) stashed_by[key] = static_cast<int64_t>(k);
      }
      stashed = tracker->tensors();
      const std::vector<at::Tensor> again_outputs = carrying_gradients(again.tensors());
      if (!again_outputs.empty()) {
        schedule::detail::WeightRoots roots;
        balance::synchronize(device);
        const int64_t held_before = memory::current_bytes(device);
        // Gradients of their own, as a stage receives them: the weight half may keep them.
        memory::reset_peak(device);
        std::vector<at::Tensor> received;
        for (const auto& g : gradients) received.push_back(g.clone());
        tick = Clock::now();
        std::vector<at::Tensor> upstream =
            schedule::detail::backward_input(again_outputs, received, leaves, &roots);
        balance::synchronize(device);
        backward_input[k].push_back(seconds_between(tick, Clock::now()));
        if (pass == 0) {
          costs[k].input_half_transient_bytes =
              std::max<int64_t>(memory::peak_bytes(device) - held_before, 0);
          costs[k].captured_gradient_bytes = balance::storage_bytes(roots.grads);
        }
        upstream.clear();  // sent to the stage before
        received.clear();
        if (pass == 0) {
          costs[k].weight_pending_bytes = memory::current_bytes(device) - held_before;
        }
        const int64_t weight_before = memory::current_bytes(device);
        memory::reset_peak(device);
        tick = Clock::now();
        schedule::detail::backward_weight(roots);
        balance::synchronize(device);
        backward_weight[k].push_back(seconds_between(tick, Clock::now()));
        if (pass == 0) {
          costs[k].weight_half_transient_bytes =
              std::max<int64_t>(memory::peak_bytes(device) - weight_before, 0);
        }
      }
      batch = std::move(output);
    }
    if (last_output != nullptr) {
      balance::detach(batch);
      *last_output = std::move(batch);
    }
  }
  for (const auto k : c10::irange(layers)) {
    costs[k].forward = median(forward[k]);
    costs[k].backward = median(backward[k]);
    costs[k].backward_input = median(backward_input[k]);
    costs[k].backward_weight = median(backward_weight[k]);
  }
  return costs;
}

LayerCosts profile_loss_costs(const Batch& output, const Batch& target,
                              const schedule::LossFunction& loss, double scale,
                              int64_t repetitions) {
  TORCH_CHECK_VALUE(repetitions >= 1, "repetitions must be positive (repetitions: ", repetitions,
                    ")");
  TORCH_CHECK_VALUE(output.size() > 0, "the model's output has no tensor");
  const c10::Device device = output[0].device();
  const Batch moved_target = balance::to_device(target, device);
  torch::AutoGradMode grad_mode(true);
  LayerCosts costs;
  costs.input_bytes = bytes_of(output);
  std::vector<double> forward, backward;
  for (int64_t pass = 0; pass < repetitions; ++pass) {
    // The last stage's output as its loss receives it: carrying gradients, from no graph.
    Batch y = output;
    balance::detach(y);
    for (const auto j : c10::irange(y.size())) {
      if (y[j].is_floating_point()) y[j].requires_grad_(true);
    }
    const std::vector<at::Tensor> outputs = carrying_gradients(y.tensors());

    balance::synchronize(device);
    const int64_t before = memory::current_bytes(device);
    auto tick = Clock::now();
    // What the stage keeps (Stage::loss), not a view of a larger buffer.
    const at::Tensor value = schedule::detail::scaled_loss(loss(y, moved_target), scale);
    balance::synchronize(device);
    forward.push_back(seconds_between(tick, Clock::now()));
    if (pass == 0) {
      costs.activation_bytes = std::max<int64_t>(memory::current_bytes(device) - before, 0);
    }
    if (!value.requires_grad() || outputs.empty()) continue;  // nothing to train through

    const int64_t held_before = memory::current_bytes(device);
    memory::reset_peak(device);
    tick = Clock::now();
    // The gradients of the output, as the last stage's backward receives them.
    std::vector<at::Tensor> gradients = torch::autograd::grad({value}, outputs);
    balance::synchronize(device);
    backward.push_back(seconds_between(tick, Clock::now()));
    if (pass == 0) {
      costs.backward_transient_bytes =
          std::max<int64_t>(memory::peak_bytes(device) - held_before, 0);
    }
  }
  costs.forward = median(forward);
  costs.backward = median(backward);
  costs.backward_input = costs.backward;
  return costs;
}

}  // namespace plan_detail
}  // namespace gpipe

#include "gpipe/schedule/run_actions.h"

#include "gpipe/memory.h"
#include "gpipe/trace.h"

#include <c10/util/Exception.h>

#include <map>
#include <optional>
#include <utility>

namespace gpipe {
namespace schedule {
namespace {

// The name of an action's task in traces.
const char* trace_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return "forward";
    case ActionKind::kBackward:
      return "backward";
    case ActionKind::kBackwardInput:
      return "backward_input";
    case ActionKind::kBackwardWeight:
      return "backward_weight";
    case ActionKind::kSendActivation:
      return "send_activation";
    case ActionKind::kRecvActivation:
      return "recv_activation";
    case ActionKind::kSendGradient:
      return "send_gradient";
    case ActionKind::kRecvGradient:
      return "recv_gradient";
  }
  return "action";
}

}  // namespace

void run_actions(const std::vector<Action>& actions, const std::vector<Stage*>& stages,
                 Transport& transport, const StepInputs& step, std::vector<at::Tensor>& losses) {
  // Per stage of this worker: received inputs and output gradients, and outputs to send.
  std::map<std::pair<int64_t, int64_t>, Batch> received_inputs, received_grads, outputs,
      grad_inputs;
  const auto key = [](const Action& a) { return std::make_pair(a.stage, a.microbatch); };
  const auto take = [](std::map<std::pair<int64_t, int64_t>, Batch>& from,
                       std::pair<int64_t, int64_t> k, const Action& a) {
    auto it = from.find(k);
    TORCH_INTERNAL_ASSERT(it != from.end(), "nothing to use for ", a);
    Batch batch = std::move(it->second);
    from.erase(it);
    return batch;
  };
  // A message between two stages of this worker goes straight into the receiver's inbox.
  const auto runs = [&stages](int64_t s) {
    return s >= 0 && s < static_cast<int64_t>(stages.size()) && stages[s] != nullptr;
  };
  for (const Action& a : actions) {
    TORCH_INTERNAL_ASSERT(
        a.stage >= 0 && a.stage < static_cast<int64_t>(stages.size()) && stages[a.stage] != nullptr,
        "no stage here for ", a);
    Stage& stage = *stages[a.stage];
    const int64_t i = a.microbatch;
    std::optional<memory::ScopedTag> tag;
    if (a.stage < memory::kMaxTags) tag.emplace(a.stage);
    trace::TraceSpan span(trace_name(a.kind), a.stage, i);
    switch (a.kind) {
      case ActionKind::kRecvActivation:
        if (runs(a.stage - 1)) {
          TORCH_INTERNAL_ASSERT(received_inputs.count(key(a)), "nothing sent here for ", a);
        } else {
          received_inputs.emplace(key(a), transport.recv(a.stage - 1, a.stage, i));
        }
        break;
      case ActionKind::kForward: {
        Batch input = stage.is_first() ? step.inputs[i] : take(received_inputs, key(a), a);
        if (stage.is_last()) {
          losses[i] = stage.forward_loss(i, input, step.targets[i], step.loss, step.scales[i]);
        } else {
          outputs.emplace(key(a), stage.forward(i, input));
        }
        break;
      }
      case ActionKind::kSendActivation:
        if (runs(a.stage + 1)) {
          received_inputs.emplace(std::make_pair(a.stage + 1, i), take(outputs, key(a), a));
        } else {
          transport.send(take(outputs, key(a), a), a.stage, a.stage + 1, i);
        }
        break;
      case ActionKind::kRecvGradient:
        if (runs(a.stage + 1)) {
          TORCH_INTERNAL_ASSERT(received_grads.count(key(a)), "nothing sent here for ", a);
        } else {
          received_grads.emplace(key(a), transport.recv(a.stage + 1, a.stage, i));
        }
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        Batch grad =
            stage.is_last() ? Batch(std::vector<at::Tensor>{}) : take(received_grads, key(a), a);
        Batch grad_input = a.kind == ActionKind::kBackward ? stage.backward(i, grad)
                                                           : stage.backward_input(i, grad);
        if (!stage.is_first()) grad_inputs.emplace(key(a), std::move(grad_input));
        break;
      }
      case ActionKind::kBackwardWeight:
        stage.backward_weight(i);
        break;
      case ActionKind::kSendGradient:
        if (runs(a.stage - 1)) {
          received_grads.emplace(std::make_pair(a.stage - 1, i), take(grad_inputs, key(a), a));
        } else {
          transport.send(take(grad_inputs, key(a), a), a.stage, a.stage - 1, i);
        }
        break;
    }
  }
}

}  // namespace schedule
}  // namespace gpipe

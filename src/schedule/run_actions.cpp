#include "schedule/run_actions.h"

#include "detail/autocast_state.h"
#include "schedule/mailbox.h"

#include "gpipe/memory.h"
#include "gpipe/trace.h"

#include <c10/util/Exception.h>

#include <optional>
#include <utility>

namespace gpipe {
namespace schedule {

namespace {

// A gradient that leaves a backward for a stage before, in memory of its own: one that views a
// larger buffer (a concatenation's gradient, split between its inputs) is copied, or the whole
// buffer would stay until that stage uses it, which may be many actions later.
at::Tensor owning(at::Tensor gradient) {
  const bool view_of_more = gradient.defined() && gradient.has_storage() &&
                            gradient.storage().nbytes() > gradient.nbytes();
  return view_of_more ? gradient.clone() : gradient;
}

}  // namespace

void run_actions(const std::vector<Action>& actions, const std::vector<Stage*>& stages,
                 Transport& transport, const StepInputs& step, std::vector<at::Tensor>& losses) {
  using detail::Slot;
  detail::Mailbox mailbox;
  // A message between two stages of this worker goes straight into the receiver's slot.
  const auto runs = [&stages](int64_t s) {
    return s >= 0 && s < static_cast<int64_t>(stages.size()) && stages[s] != nullptr;
  };
  // Skips across stages: one message on the skip lane per pair of stages and micro-batch, with
  // the tensors (or gradients) of every route between the two, in the routes' order (sorted by
  // the other stage). Sent by the forward (backward) that makes them, received by the one that
  // uses them: the other stage's forward (backward) of the micro-batch came before this one's on
  // the pipeline's path, so the message is on its way.
  const auto send_skips = [&](int64_t from, const std::vector<skip::SkipRoute>& routes,
                              SkipTensors tensors, int64_t i) {
    for (size_t k = 0; k < routes.size();) {
      const int64_t to = routes[k].other_stage(from);
      std::vector<at::Tensor> message;
      for (; k < routes.size() && routes[k].other_stage(from) == to; ++k) {
        message.push_back(std::move(tensors[k]));
      }
      if (runs(to)) {
        mailbox.put_skips(from, to, i, Batch(std::move(message)));
      } else {
        transport.send(Batch(std::move(message)), from, to, i, Lane::kSkip);
      }
    }
  };
  const auto recv_skips = [&](int64_t to, const std::vector<skip::SkipRoute>& routes, int64_t i) {
    SkipTensors tensors;
    for (size_t k = 0; k < routes.size();) {
      const int64_t from = routes[k].other_stage(to);
      Batch message =
          runs(from) ? mailbox.take_skips(from, to, i) : transport.recv(from, to, i, Lane::kSkip);
      for (const auto& x : message) {
        TORCH_CHECK_VALUE(k < routes.size() && routes[k].other_stage(to) == from, "stage ", to,
                          " received ", message.size(), " skip tensor(s) from stage ", from,
                          " for micro-batch ", i, ", more than its routes from there");
        tensors.push_back(x);
        ++k;
      }
      TORCH_CHECK_VALUE(k == routes.size() || routes[k].other_stage(to) != from, "stage ", to,
                        " received ", message.size(), " skip tensor(s) from stage ", from,
                        " for micro-batch ", i, ", fewer than its routes from there");
    }
    return tensors;
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
    // Backwards run outside autocast, as PyTorch's recipe runs loss.backward(); a recomputation
    // inside them restores its forward's settings (checkpoint.h).
    std::optional<gpipe::detail::UseAutocast> no_autocast;
    if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput ||
        a.kind == ActionKind::kBackwardWeight) {
      no_autocast.emplace(gpipe::detail::AutocastState{});
    }
    switch (a.kind) {
      case ActionKind::kRecvActivation:
        if (runs(a.stage - 1)) {
          TORCH_INTERNAL_ASSERT(mailbox.holds(Slot::kInput, a.stage, i), "nothing sent here for ",
                                a);
        } else {
          mailbox.put(Slot::kInput, a.stage, i, transport.recv(a.stage - 1, a.stage, i));
        }
        break;
      case ActionKind::kForward: {
        Batch input = stage.is_first() ? step.inputs[i] : mailbox.take(Slot::kInput, a);
        const SkipTensors popped = recv_skips(a.stage, stage.skip_pops(), i);
        if (step.outputs != nullptr) {
          SkipTensors stashed;
          Batch output = stage.forward_only(i, input, popped, &stashed);
          if (!stage.is_last()) {
            mailbox.put(Slot::kOutput, a.stage, i, std::move(output));
            send_skips(a.stage, stage.skip_stashes(), std::move(stashed), i);
            break;
          }
          if (!step.targets.empty()) {
            losses[i] = stage.loss(output, step.targets[i], step.loss, step.scales[i]);
          }
          (*step.outputs)[i] = std::move(output);
        } else if (stage.is_last()) {
          losses[i] =
              stage.forward_loss(i, input, step.targets[i], step.loss, step.scales[i], popped);
        } else {
          SkipTensors stashed;
          mailbox.put(Slot::kOutput, a.stage, i, stage.forward(i, input, popped, &stashed));
          send_skips(a.stage, stage.skip_stashes(), std::move(stashed), i);
        }
        break;
      }
      case ActionKind::kSendActivation:
        if (runs(a.stage + 1)) {
          mailbox.put(Slot::kInput, a.stage + 1, i, mailbox.take(Slot::kOutput, a));
        } else {
          transport.send(mailbox.take(Slot::kOutput, a), a.stage, a.stage + 1, i);
        }
        break;
      case ActionKind::kRecvGradient:
        if (runs(a.stage + 1)) {
          TORCH_INTERNAL_ASSERT(mailbox.holds(Slot::kOutputGradient, a.stage, i),
                                "nothing sent here for ", a);
        } else {
          mailbox.put(Slot::kOutputGradient, a.stage, i, transport.recv(a.stage + 1, a.stage, i));
        }
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        Batch grad = stage.is_last() ? Batch(std::vector<at::Tensor>{})
                                     : mailbox.take(Slot::kOutputGradient, a);
        const SkipTensors stashed_grads = recv_skips(a.stage, stage.skip_stashes(), i);
        SkipTensors popped_grads;
        Batch grad_input = a.kind == ActionKind::kBackward
                               ? stage.backward(i, grad, stashed_grads, &popped_grads)
                               : stage.backward_input(i, grad, stashed_grads, &popped_grads);
        for (auto& g : popped_grads) g = owning(std::move(g));
        send_skips(a.stage, stage.skip_pops(), std::move(popped_grads), i);
        if (!stage.is_first()) {
          for (const auto j : c10::irange(grad_input.size())) grad_input[j] = owning(grad_input[j]);
          mailbox.put(Slot::kInputGradient, a.stage, i, std::move(grad_input));
        }
        break;
      }
      case ActionKind::kBackwardWeight:
        stage.backward_weight(i);
        break;
      case ActionKind::kSendGradient:
        if (runs(a.stage - 1)) {
          mailbox.put(Slot::kOutputGradient, a.stage - 1, i, mailbox.take(Slot::kInputGradient, a));
        } else {
          transport.send(mailbox.take(Slot::kInputGradient, a), a.stage, a.stage - 1, i);
        }
        break;
    }
  }
}

}  // namespace schedule
}  // namespace gpipe

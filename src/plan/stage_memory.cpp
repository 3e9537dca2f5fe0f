#include "plan/stage_memory.h"

#include <algorithm>

namespace gpipe {
namespace plan_detail {

int64_t StageMemory::held(const schedule::HeldMicrobatches& moment,
                          CheckpointMode checkpoint) const {
  using Starting = schedule::HeldMicrobatches::Starting;
  const bool backward =
      moment.starting == Starting::kBackward || moment.starting == Starting::kBackwardInput;
  int64_t starting = 0;
  switch (moment.starting) {
    case Starting::kNothing:
      break;
    case Starting::kForward:
      starting = forward_transient;
      break;
    case Starting::kBackward:
      starting = backward_transient;
      break;
    case Starting::kBackwardInput:
      starting = input_transient;
      break;
    case Starting::kBackwardWeight:
      starting = weight_transient;
      break;
  }
  // Between ranks (input_from_rank, output_to_rank) a batch travels with a header, packed into
  // one message where it fits, a copy on both ends; else as its own tensors, uncopied, its
  // receive posted once its header has come (c10d_transport.h).
  const int64_t in = input_from_rank ? input_bytes : 0, out = output_to_rank ? output_bytes : 0;
  const auto packed = [&](int64_t bytes) {
    return bytes > 0 && bytes + message_header <= one_message_bytes;
  };
  // What a batch that came occupies, and what a receive posted ahead of it holds.
  const auto landed = [&](int64_t bytes) { return packed(bytes) ? bytes + message_header : bytes; };
  const auto posted = [&](int64_t bytes) {
    return bytes == 0 ? 0 : packed(bytes) ? bytes + message_header : message_header;
  };
  // Receives posted ahead of the activations and gradients still to come, and the batch an
  // action that starts takes: its input, the gradient of its output.
  const int64_t received = std::min(receive_window, moment.forwards_left) * posted(in) +
                           std::min(receive_window, moment.backwards_left) * posted(out) +
                           (moment.starting == Starting::kForward ? landed(in)
                            : backward                            ? landed(out)
                                                                  : 0);
  // A send holds its message until a message from its receiver says it came (the timeline's
  // count); an uncopied output holds only tensors its stage keeps anyway.
  const int64_t sent = moment.unreturned * (packed(out) ? out + message_header : 0) +
                       moment.sent_upstream * landed(in);
  const int64_t passed =
      moment.upstream * upstream + moment.downstream * downstream + sent + received;
  switch (checkpoint) {
    case CheckpointMode::kNever:
      // Each micro-batch forwarded holds its activations, one past its input half what that
      // half left for the weight half too; an action that starts allocates more.
      // Between ranks each also holds its own copy of the input.
      return moment.live * (activations + landed(in)) + moment.awaiting * pending + starting +
             passed;
    case CheckpointMode::kAlways:
      // Each holds its input, between ranks the message it came in (and its output, which
      // within a process is the next stage's input); a backward that starts recomputes the
      // activations.
      return moment.live * (kept + landed(in) - in + out) + (backward ? recomputed : 0) + starting +
             passed;
    case CheckpointMode::kExceptLast:
      // And the last micro-batch keeps its activations whole.
      return moment.live * (kept + landed(in) - in + out) + recomputed +
             (backward ? recomputed : 0) + starting + passed;
  }
  return 0;
}

int64_t StageMemory::lagging(const schedule::HeldMicrobatches& moment) const {
  return std::max(upstream_crosses && moment.upstream == 0 ? upstream : 0,
                  downstream_crosses && moment.downstream == 0 ? downstream : 0);
}

StageMemory stage_memory(const std::vector<LayerCosts>& layers, const LayerCosts& loss,
                         const std::vector<int64_t>& first, int64_t s, double param_scale) {
  const int64_t S = static_cast<int64_t>(first.size()) - 1;
  // What a micro-batch holds from its forward to its backward; and the most its backward holds
  // while it runs: the layers' backwards run last to first, each beside what the layers before
  // it keep, the gradient of its output and what it allocates itself. Past its backward (or
  // input half), a micro-batch's gradients go upstream, of its input and of what it popped
  // from the stage before, until that stage uses them; those popped from further up go on, one
  // micro-batch's at a time.
  int64_t activations = 0, pending = 0, parameters = 0, backward_peak = 0, forward_peak = 0;
  int64_t weight_half_peak = 0;
  int64_t upstream = s > 0 ? layers[first[s]].input_bytes : 0, further = 0;
  for (int64_t k = first[s]; k < first[s + 1]; ++k) {
    const bool chained = k > first[s];
    // A layer's forward runs beside what the layers before it keep, its input still there.
    forward_peak = std::max(
        forward_peak, activations + layers[k].activation_bytes + layers[k].forward_transient_bytes);
    weight_half_peak = std::max(weight_half_peak, layers[k].weight_half_transient_bytes);
    activations += chained ? layers[k].chained_activation_bytes : layers[k].activation_bytes;
    pending += chained ? layers[k].chained_weight_pending_bytes : layers[k].weight_pending_bytes;
    parameters += layers[k].parameter_bytes;
    backward_peak = std::max(
        backward_peak, activations + layers[k].output_bytes + layers[k].backward_transient_bytes);
    for (const auto& popped : layers[k].popped) {
      if (popped.stashed_by >= first[s]) continue;  // within the stage
      (s > 0 && popped.stashed_by < first[s - 1] ? further : upstream) += popped.bytes;
    }
  }
  // The last stage keeps what its loss saved; its backward starts with the loss's, beside
  // everything the stage keeps.
  if (s + 1 == S) {
    activations += loss.activation_bytes;
    backward_peak = std::max(backward_peak, activations + loss.backward_transient_bytes);
  }
  StageMemory memory;
  memory.activations = std::max<int64_t>(activations, 0);
  // A split backward's input half frees nothing until it ends: it runs its layers last to
  // first beside the whole graph and the gradients captured so far for the weight half.
  int64_t input_half_peak = 0, captured = 0;
  for (int64_t k = first[s + 1] - 1; k >= first[s]; --k) {
    input_half_peak = std::max(input_half_peak, captured + layers[k].input_half_transient_bytes);
    captured += layers[k].captured_gradient_bytes;
  }
  if (s + 1 == S) input_half_peak = std::max(input_half_peak, loss.backward_transient_bytes);
  // The first stage's input half computes nothing: its weight half is the whole backward, and
  // each micro-batch keeps all it holds until then. A weight half frees the graph as it runs.
  const int64_t whole = std::max<int64_t>(backward_peak - memory.activations, 0);
  memory.forward_transient = forward_peak;
  memory.backward_transient = whole;
  memory.input_transient = s > 0 ? input_half_peak : 0;
  memory.weight_transient = s > 0 ? weight_half_peak : whole;
  memory.pending = s == 0 ? 0 : std::max(pending, -memory.activations);
  const int64_t loss_kept = s + 1 == S ? loss.activation_bytes : 0;
  memory.kept = layers[first[s]].input_bytes + loss_kept;
  memory.recomputed = std::max<int64_t>(memory.activations - loss_kept, 0);
  memory.input_bytes = s > 0 ? layers[first[s]].input_bytes : 0;
  memory.output_bytes = s + 1 < S ? layers[first[s + 1]].input_bytes : 0;
  memory.upstream = upstream;
  // What this stage sent the next stays until the next one's weight half, which may come after
  // this stage's own; and so do the skips it stashed for later stages, which hold them as long.
  memory.downstream = s + 1 < S ? layers[first[s + 1]].input_bytes : 0;
  for (int64_t k = first[s + 1]; k < first[S]; ++k) {
    for (const auto& popped : layers[k].popped) {
      if (popped.stashed_by >= first[s] && popped.stashed_by < first[s + 1]) {
        memory.downstream += popped.bytes;
      }
    }
  }
  memory.fixed = further + static_cast<int64_t>(param_scale * static_cast<double>(parameters));
  return memory;
}

}  // namespace plan_detail
}  // namespace gpipe

#include "plan/stage_memory.h"

#include <algorithm>

namespace gpipe {
namespace plan_detail {

int64_t StageMemory::held(const schedule::HeldMicrobatches& moment, CheckpointMode checkpoint,
                          bool split) const {
  const int64_t starting = moment.backward ? transient : 0;
  // Between workers, the simulated order is no promise: one micro-batch's gradients are always
  // counted on their way.
  const int64_t on_their_way = crosses ? std::max<int64_t>(moment.upstream, 1) : moment.upstream;
  const int64_t passed = on_their_way * upstream + moment.downstream * downstream;
  switch (checkpoint) {
    case CheckpointMode::kNever:
      // Each micro-batch forwarded holds its activations, one past its input half what that
      // half left for the weight half too; a backward that starts allocates more.
      return moment.live * activations + (split ? moment.awaiting * pending : 0) + starting +
             passed;
    case CheckpointMode::kAlways:
      // Each holds its input; a backward that starts recomputes the activations.
      return moment.live * kept + (moment.backward ? activations : 0) + starting + passed;
    case CheckpointMode::kExceptLast:
      // And the last micro-batch keeps its activations whole.
      return moment.live * kept + activations + (moment.backward ? activations : 0) + starting +
             passed;
  }
  return 0;
}

StageMemory stage_memory(const std::vector<LayerCosts>& layers, const LayerCosts& loss,
                         const std::vector<int64_t>& first, int64_t s, bool split, bool crosses,
                         double param_scale) {
  const int64_t S = static_cast<int64_t>(first.size()) - 1;
  // What a micro-batch holds from its forward to its backward; and the most its backward holds
  // while it runs: the layers' backwards run last to first, each beside what the layers before
  // it keep, the gradient of its output and what it allocates itself. Past its backward (or
  // input half), a micro-batch's gradients go upstream, of its input and of what it popped
  // from the stage before, until that stage uses them; those popped from further up go on, one
  // micro-batch's at a time.
  int64_t activations = 0, pending = 0, parameters = 0, backward_peak = 0;
  int64_t upstream = s > 0 ? layers[first[s]].input_bytes : 0, further = 0;
  for (int64_t k = first[s]; k < first[s + 1]; ++k) {
    const bool chained = k > first[s];
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
  // each micro-batch keeps all it holds until then.
  memory.transient =
      split && s > 0 ? input_half_peak : std::max<int64_t>(backward_peak - memory.activations, 0);
  memory.pending = s == 0 ? 0 : std::max(pending, -memory.activations);
  memory.kept = layers[first[s]].input_bytes;
  memory.upstream = upstream;
  memory.crosses = crosses;
  // What this stage sent the next stays until the next one's weight half, which may come after
  // this stage's own.
  memory.downstream = s + 1 < S ? layers[first[s + 1]].input_bytes : 0;
  memory.fixed = further + static_cast<int64_t>(param_scale * static_cast<double>(parameters));
  return memory;
}

}  // namespace plan_detail
}  // namespace gpipe

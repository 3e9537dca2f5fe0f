#include "gpipe/checkpoint.h"

#include "detail/checkpointing.h"

#include <c10/util/Exception.h>

#include <utility>

namespace gpipe {

CheckpointMode parse_checkpoint_mode(const std::string& name) {
  if (name == "always") return CheckpointMode::kAlways;
  if (name == "except_last") return CheckpointMode::kExceptLast;
  if (name == "never") return CheckpointMode::kNever;
  TORCH_CHECK_VALUE(false, "checkpoint is not one of 'always', 'except_last', or 'never' (got '",
                    name, "')");
}

std::ostream& operator<<(std::ostream& out, CheckpointMode mode) {
  switch (mode) {
    case CheckpointMode::kAlways:
      return out << "always";
    case CheckpointMode::kExceptLast:
      return out << "except_last";
    case CheckpointMode::kNever:
      return out << "never";
  }
  return out << "CheckpointMode(" << static_cast<int>(mode) << ")";
}

bool is_checkpointing() { return detail::EnableCheckpointing::active(); }
bool is_recomputing() { return detail::EnableRecomputing::active(); }

Batch checkpoint(BatchFunction function, const Batch& input) {
  detail::Checkpointing checkpointing(std::move(function), input);
  Batch output = checkpointing.checkpoint();
  checkpointing.recompute(output);
  return output;
}

}  // namespace gpipe

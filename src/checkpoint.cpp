#include "gpipe/checkpoint.h"

#include "detail/checkpointing.h"
#include "detail/enum_names.h"

#include <c10/util/Exception.h>

#include <utility>

namespace gpipe {

namespace {

constexpr detail::EnumName<CheckpointMode> kCheckpointModes[] = {
    {CheckpointMode::kAlways, "always"},
    {CheckpointMode::kExceptLast, "except_last"},
    {CheckpointMode::kNever, "never"}};

}  // namespace

CheckpointMode parse_checkpoint_mode(const std::string& name) {
  const auto mode = detail::value_named(name, kCheckpointModes);
  TORCH_CHECK_VALUE(mode, "checkpoint is not one of 'always', 'except_last', or 'never' (got '",
                    name, "')");
  return *mode;
}

std::ostream& operator<<(std::ostream& out, CheckpointMode mode) {
  return detail::print_name(out, mode, kCheckpointModes, "CheckpointMode");
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

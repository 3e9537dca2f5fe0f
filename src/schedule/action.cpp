#include "gpipe/schedule/action.h"

#include "detail/enum_names.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cctype>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {
namespace {

// Each kind's names: as printed, its letters in the compact notation (PyTorch's; no kind's
// letters begin another's, so a text reads one way) and its task's name in traces.
struct KindNames {
  ActionKind kind;
  const char* name;
  std::string_view letters;
  const char* trace_name;
};
constexpr KindNames kKindNames[] = {
    {ActionKind::kForward, "Forward", "F", "forward"},
    {ActionKind::kBackward, "Backward", "B", "backward"},
    {ActionKind::kBackwardInput, "BackwardInput", "I", "backward_input"},
    {ActionKind::kBackwardWeight, "BackwardWeight", "W", "backward_weight"},
    {ActionKind::kSendActivation, "SendActivation", "SEND_F", "send_activation"},
    {ActionKind::kRecvActivation, "RecvActivation", "RECV_F", "recv_activation"},
    {ActionKind::kSendGradient, "SendGradient", "SEND_B", "send_gradient"},
    {ActionKind::kRecvGradient, "RecvGradient", "RECV_B", "recv_gradient"}};

// `kind`'s row, or nullptr for a value out of range.
const KindNames* names_of(ActionKind kind) {
  for (const auto& row : kKindNames) {
    if (row.kind == kind) return &row;
  }
  return nullptr;
}

// Digits of a stage or micro-batch: more than this many cannot be in range of any schedule.
constexpr size_t kMaxDigits = 9;

// Reads the digits of `text` from `at` on; -1 if there are none or too many.
int64_t number(const std::string& text, size_t& at) {
  const size_t begin = at;
  while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) ++at;
  if (at == begin || at - begin > kMaxDigits) return -1;
  return std::stoll(text.substr(begin, at - begin));
}

}  // namespace

std::ostream& operator<<(std::ostream& out, ActionKind kind) {
  if (const KindNames* names = names_of(kind)) return out << names->name;
  return out << "ActionKind(" << static_cast<int>(kind) << ")";
}

const char* trace_name(ActionKind kind) {
  const KindNames* names = names_of(kind);
  return names != nullptr ? names->trace_name : "action";
}

std::ostream& operator<<(std::ostream& out, Placement placement) {
  static constexpr gpipe::detail::EnumName<Placement> kNames[] = {{Placement::kLooped, "looped"},
                                                                  {Placement::kV, "V"}};
  return gpipe::detail::print_name(out, placement, kNames, "Placement");
}

int64_t worker_of(Placement placement, int64_t stage, int64_t num_workers) {
  if (placement == Placement::kV && stage >= num_workers) return 2 * num_workers - 1 - stage;
  return stage % num_workers;
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight;
}

bool splits_backward(const Schedule& schedule) {
  for (const auto& actions : schedule.actions) {
    for (const Action& a : actions) {
      if (a.kind == ActionKind::kBackwardInput || a.kind == ActionKind::kBackwardWeight)
        return true;
    }
  }
  return false;
}

bool operator==(const Action& a, const Action& b) {
  return a.kind == b.kind && a.microbatch == b.microbatch && a.stage == b.stage;
}

bool operator!=(const Action& a, const Action& b) { return !(a == b); }

std::string to_string(const Action& action) {
  std::ostringstream out;
  out << action.kind << "(microbatch=" << action.microbatch << ", stage=" << action.stage << ")";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Action& action) {
  return out << to_string(action);
}

std::string compact(const Action& action) {
  const KindNames* names = names_of(action.kind);
  return c10::str(action.stage, names != nullptr ? names->letters : "?", action.microbatch);
}

Action parse_action(const std::string& text) {
  size_t at = 0;
  const int64_t stage = number(text, at);
  std::optional<ActionKind> kind;
  for (const auto& row : kKindNames) {
    if (stage >= 0 && text.compare(at, row.letters.size(), row.letters) == 0) {
      kind = row.kind;
      at += row.letters.size();
      break;
    }
  }
  const int64_t microbatch = kind ? number(text, at) : -1;
  if (stage >= 0 && kind && microbatch >= 0 && at == text.size()) {
    return {*kind, microbatch, stage};
  }
  const bool fsdp =
      text.find("UNSHARD") != std::string::npos || text.find("RESHARD") != std::string::npos;
  TORCH_CHECK_VALUE(!fsdp, "'", text,
                    "': UNSHARD and RESHARD (FSDP in torch.distributed.pipelining) are not "
                    "actions of gpipe's schedules");
  TORCH_CHECK_VALUE(false, "'", text,
                    "' is not an action: expected <stage><kind><micro-batch> with kind F, B, I, W, "
                    "SEND_F, RECV_F, SEND_B or RECV_B (e.g. 2F1: the forward of micro-batch 1 on "
                    "stage 2)");
}

}  // namespace schedule
}  // namespace gpipe

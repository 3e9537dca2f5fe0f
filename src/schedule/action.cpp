#include "gpipe/schedule/action.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cctype>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace gpipe {
namespace schedule {
namespace {

// Each kind's letters in the compact notation; the longer ones first, so that "SEND_F" is not
// read as a stage followed by "S".
const std::vector<std::pair<std::string, ActionKind>>& notation() {
  static const std::vector<std::pair<std::string, ActionKind>> kinds{
      {"SEND_F", ActionKind::kSendActivation},
      {"RECV_F", ActionKind::kRecvActivation},
      {"SEND_B", ActionKind::kSendGradient},
      {"RECV_B", ActionKind::kRecvGradient},
      {"F", ActionKind::kForward},
      {"B", ActionKind::kBackward},
      {"I", ActionKind::kBackwardInput},
      {"W", ActionKind::kBackwardWeight}};
  return kinds;
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
  switch (kind) {
    case ActionKind::kForward:
      return out << "Forward";
    case ActionKind::kBackward:
      return out << "Backward";
    case ActionKind::kBackwardInput:
      return out << "BackwardInput";
    case ActionKind::kBackwardWeight:
      return out << "BackwardWeight";
    case ActionKind::kSendActivation:
      return out << "SendActivation";
    case ActionKind::kRecvActivation:
      return out << "RecvActivation";
    case ActionKind::kSendGradient:
      return out << "SendGradient";
    case ActionKind::kRecvGradient:
      return out << "RecvGradient";
  }
  return out << "ActionKind(" << static_cast<int>(kind) << ")";
}

std::ostream& operator<<(std::ostream& out, Placement placement) {
  switch (placement) {
    case Placement::kLooped:
      return out << "looped";
    case Placement::kV:
      return out << "V";
  }
  return out << "Placement(" << static_cast<int>(placement) << ")";
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
  for (const auto& [letters, kind] : notation()) {
    if (kind == action.kind) return c10::str(action.stage, letters, action.microbatch);
  }
  return c10::str(action.stage, "?", action.microbatch);
}

Action parse_action(const std::string& text) {
  size_t at = 0;
  const int64_t stage = number(text, at);
  std::optional<ActionKind> kind;
  for (const auto& [letters, k] : notation()) {
    if (stage >= 0 && text.compare(at, letters.size(), letters) == 0) {
      kind = k;
      at += letters.size();
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

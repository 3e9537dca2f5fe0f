#include "gpipe/schedule/action.h"

#include <sstream>

namespace gpipe {
namespace schedule {

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

}  // namespace schedule
}  // namespace gpipe

#include "schedule/mailbox.h"

#include <c10/util/Exception.h>

#include <utility>

namespace gpipe {
namespace schedule {
namespace detail {

void Mailbox::put(Slot slot, int64_t stage, int64_t microbatch, Batch message) {
  slots_.emplace(std::make_tuple(slot, stage, microbatch), std::move(message));
}

bool Mailbox::holds(Slot slot, int64_t stage, int64_t microbatch) const {
  return slots_.count(std::make_tuple(slot, stage, microbatch)) != 0;
}

Batch Mailbox::take(Slot slot, const Action& action) {
  auto it = slots_.find(std::make_tuple(slot, action.stage, action.microbatch));
  TORCH_INTERNAL_ASSERT(it != slots_.end(), "nothing to use for ", action);
  Batch message = std::move(it->second);
  slots_.erase(it);
  return message;
}

void Mailbox::put_skips(int64_t from, int64_t to, int64_t microbatch, Batch message) {
  skips_.emplace(std::make_tuple(from, to, microbatch), std::move(message));
}

Batch Mailbox::take_skips(int64_t from, int64_t to, int64_t microbatch) {
  auto it = skips_.find(std::make_tuple(from, to, microbatch));
  TORCH_INTERNAL_ASSERT(it != skips_.end(), "no skips sent from stage ", from, " to stage ", to,
                        " for micro-batch ", microbatch);
  Batch message = std::move(it->second);
  skips_.erase(it);
  return message;
}

}  // namespace detail
}  // namespace schedule
}  // namespace gpipe

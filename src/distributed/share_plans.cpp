#include "gpipe/distributed/share_plans.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>
#include <string>

namespace gpipe {
namespace distributed {
namespace {

// "ok", then per plan: schedule, stages per worker, micro-batches, checkpoint, the number of
// stages and their layers; or "error <what rank 0 threw>".
std::string encode(const std::vector<Plan>& plans) {
  std::ostringstream out;
  out << "ok";
  for (const auto& p : plans) {
    out << " " << static_cast<int>(p.schedule) << " " << p.stages_per_worker << " "
        << p.microbatches << " " << static_cast<int>(p.checkpoint) << " " << p.balance.size();
    for (const int64_t b : p.balance) out << " " << b;
  }
  return out.str();
}

std::vector<Plan> decode(const std::string& text) {
  constexpr size_t kError = 6;  // "error "
  TORCH_CHECK(text.rfind("ok", 0) == 0,
              "rank 0 could not plan: ", text.substr(std::min(text.size(), kError)));
  std::istringstream in(text.substr(2));
  std::vector<Plan> plans;
  int schedule = 0, checkpoint = 0;
  Plan p;
  size_t stages = 0;
  while (in >> schedule >> p.stages_per_worker >> p.microbatches >> checkpoint >> stages) {
    p.schedule = static_cast<schedule::ScheduleKind>(schedule);
    p.checkpoint = static_cast<CheckpointMode>(checkpoint);
    p.balance.assign(stages, 0);
    for (auto& b : p.balance) in >> b;
    plans.push_back(p);
  }
  return plans;
}

void set(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

}  // namespace

std::vector<Plan> share_plans(const ProcessGroup& ranks,
                              const std::function<std::vector<Plan>()>& plan_here) {
  // Each call its own key: every rank makes the same calls in the same order, and counts its
  // own in the group's store.
  const int64_t call =
      ranks.store->add("gpipe/plans/calls_of_rank_" + std::to_string(ranks.rank()), 1);
  const std::string key = "gpipe/plans/" + std::to_string(call);
  if (ranks.rank() != 0) {
    const std::vector<uint8_t> bytes = ranks.store->get(key);
    return decode(std::string(bytes.begin(), bytes.end()));
  }
  try {
    std::vector<Plan> plans = plan_here();
    set(*ranks.store, key, encode(plans));
    return plans;
  } catch (const std::exception& error) {
    // The others would wait for plans until their timeout: tell them there are none.
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    set(*ranks.store, key,
        std::string("error ") + (c10_error ? c10_error->what_without_backtrace() : error.what()));
    throw;
  }
}

}  // namespace distributed
}  // namespace gpipe

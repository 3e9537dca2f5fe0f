#include "clock_alignment.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <limits>
#include <vector>

namespace gpipe {
namespace distributed {
namespace {

using Clock = std::chrono::steady_clock;

// Tries per rank: the shortest round trip of these sets the uncertainty.
constexpr int kTries = 8;

double microseconds(Clock::duration duration) {
  return std::chrono::duration<double, std::micro>(duration).count();
}

// The value of `key` once it is set, at most `timeout` later.
std::string await(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout,
                  int64_t rank, int64_t peer) {
  try {
    store.wait({key}, timeout);
    const std::vector<uint8_t> value = store.get(key);
    return std::string(value.begin(), value.end());
  } catch (const c10::Error& error) {
    TORCH_CHECK(false, "rank ", rank, " got no answer from rank ", peer, " within ",
                timeout.count() / 1000.0,
                " s while aligning the ranks' clocks: ", error.what_without_backtrace());
  }
  return {};  // not reached
}

void set(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

}  // namespace

TimelineOrigin align_clocks(c10d::Store& store, const std::string& name, int64_t rank,
                            int64_t world_size, std::chrono::milliseconds timeout) {
  const auto key = [&](int64_t r, int k, const char* what) {
    return "gpipe/clock/" + name + "/" + std::to_string(r) + "/" + std::to_string(k) + "/" + what;
  };
  if (rank == 0) {
    // One rank at a time: a rank's round trip never waits for rank 0 to answer another.
    const Clock::time_point origin = Clock::now();
    for (int k = 0; k < kTries; ++k) {
      for (int64_t r = 1; r < world_size; ++r) {
        set(store, key(r, k, "turn"), "");
        await(store, key(r, k, "ask"), timeout, 0, r);
        char reading[64];
        std::snprintf(reading, sizeof(reading), "%.17g", microseconds(Clock::now() - origin));
        set(store, key(r, k, "answer"), reading);
      }
    }
    return {origin, 0};
  }
  TimelineOrigin best{Clock::now(), std::numeric_limits<double>::infinity()};
  for (int k = 0; k < kTries; ++k) {
    await(store, key(rank, k, "turn"), timeout, rank, 0);
    const Clock::time_point asked = Clock::now();
    set(store, key(rank, k, "ask"), "");
    const double reading_us = std::stod(await(store, key(rank, k, "answer"), timeout, rank, 0));
    const Clock::time_point answered = Clock::now();
    const double half_trip_us = microseconds(answered - asked) / 2;
    if (half_trip_us < best.uncertainty_us) {
      // Rank 0 read `reading_us` at the middle of the round trip, give or take half of it.
      best.origin = asked + (answered - asked) / 2 -
                    std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double, std::micro>(reading_us));
      best.uncertainty_us = half_trip_us;
    }
    for (const char* what : {"turn", "ask", "answer"}) store.deleteKey(key(rank, k, what));
  }
  return best;
}

}  // namespace distributed
}  // namespace gpipe

#include "clock_alignment.h"

#include "detail/message_of.h"
#include "failure_monitor.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <limits>
#include <thread>

namespace gpipe {
namespace distributed {
namespace {

using Clock = std::chrono::steady_clock;

// Tries per rank: the shortest round trip of these sets the uncertainty.
constexpr int kTries = 8;

double microseconds(Clock::duration duration) {
  return std::chrono::duration<double, std::micro>(duration).count();
}

// The store calls of one rank's alignment, their failures explained.
class Exchange {
 public:
  Exchange(BoundedStore& store, const Environment& environment, std::chrono::milliseconds timeout)
      : store_(store), environment_(environment), timeout_(timeout) {}

  void set(const std::string& key, const std::string& value) {
    call([&] { store_.set(key, value); });
  }

  // The value of `key` once `peer` has set it; `seen`, when the key was seen there. Polls (a
  // bounded store cannot wait for a key): the answer is seen at most a poll late, which only
  // widens the round trip it ends.
  std::string await(const std::string& key, int64_t peer, Clock::time_point* seen = nullptr) {
    const auto deadline = Clock::now() + timeout_;
    for (bool present = false; !present;) {
      call([&] { present = store_.check(key); });
      if (present) {
        if (seen != nullptr) *seen = Clock::now();
        break;
      }
      TORCH_CHECK(Clock::now() < deadline, "rank ", environment_.rank, " got no answer from rank ",
                  peer, " within ", timeout_.count(), " ms while aligning the ranks' clocks");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    std::string value;
    call([&] { value = store_.get(key); });
    return value;
  }

 private:
  template <typename Function>
  void call(const Function& function) {
    try {
      function();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, lost_store_message(environment_, detail::message_of(e)), " while rank ",
                  environment_.rank, " aligned its clock");
    }
  }

  BoundedStore& store_;
  const Environment& environment_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

TimelineOrigin align_clocks(BoundedStore& store, const Environment& environment,
                            const std::string& name, std::chrono::milliseconds timeout) {
  const auto key = [&](int64_t r, int k, const char* what) {
    return "gpipe/clock/" + name + "/" + std::to_string(r) + "/" + std::to_string(k) + "/" + what;
  };
  Exchange exchange(store, environment, timeout);
  const int64_t rank = environment.rank;
  if (rank == 0) {
    // One rank at a time: a rank's round trip never waits for rank 0 to answer another.
    const Clock::time_point origin = Clock::now();
    for (int k = 0; k < kTries; ++k) {
      for (int64_t r = 1; r < environment.world_size; ++r) {
        exchange.set(key(r, k, "turn"), "");
        exchange.await(key(r, k, "ask"), r);
        char reading[64];
        std::snprintf(reading, sizeof(reading), "%.17g", microseconds(Clock::now() - origin));
        exchange.set(key(r, k, "answer"), reading);
      }
    }
    return {origin, 0};
  }
  TimelineOrigin best{Clock::now(), std::numeric_limits<double>::infinity()};
  for (int k = 0; k < kTries; ++k) {
    exchange.await(key(rank, k, "turn"), 0);
    const Clock::time_point asked = Clock::now();
    exchange.set(key(rank, k, "ask"), "");
    Clock::time_point answered;  // the answer was there; reading its value adds nothing
    const double reading_us = std::stod(exchange.await(key(rank, k, "answer"), 0, &answered));
    const double half_trip_us = microseconds(answered - asked) / 2;
    if (half_trip_us < best.uncertainty_us) {
      // Rank 0 read `reading_us` at the middle of the round trip, give or take half of it.
      best.origin = asked + (answered - asked) / 2 -
                    std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double, std::micro>(reading_us));
      best.uncertainty_us = half_trip_us;
    }
  }
  return best;
}

}  // namespace distributed
}  // namespace gpipe

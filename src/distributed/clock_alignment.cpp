#include "distributed/clock_alignment.h"

#include "detail/message_of.h"
#include "distributed/failure_monitor.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

namespace gpipe {
namespace distributed {
namespace {

using Clock = std::chrono::steady_clock;

// Tries per rank: the shortest round trip sets the uncertainty. Where the store is slow (1.13's
// takes tens of ms a call) tries stop after the budget: each would cost as much and gain little.
constexpr int kTries = 8;
constexpr auto kBudget = std::chrono::milliseconds(50);

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
    // One rank at a time: a rank's round trip never waits for rank 0 to answer another. A rank
    // says when it asks for the last time.
    const Clock::time_point origin = Clock::now();
    std::vector<int64_t> asking(environment.world_size - 1);
    std::iota(asking.begin(), asking.end(), 1);
    for (int k = 0; !asking.empty(); ++k) {
      std::vector<int64_t> again;
      for (const int64_t r : asking) {
        exchange.set(key(r, k, "turn"), "");
        const std::string ask = exchange.await(key(r, k, "ask"), r);
        char reading[64];
        std::snprintf(reading, sizeof(reading), "%.17g", microseconds(Clock::now() - origin));
        exchange.set(key(r, k, "answer"), reading);
        if (ask != "last") again.push_back(r);
      }
      asking = std::move(again);
    }
    return {origin, 0};
  }
  const Clock::time_point start = Clock::now();
  TimelineOrigin best{start, std::numeric_limits<double>::infinity()};
  for (int k = 0;; ++k) {
    const bool last = k + 1 >= kTries || Clock::now() - start >= kBudget;
    exchange.await(key(rank, k, "turn"), 0);
    const Clock::time_point asked = Clock::now();
    exchange.set(key(rank, k, "ask"), last ? "last" : "more");
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
    if (last) break;
  }
  return best;
}

}  // namespace distributed
}  // namespace gpipe

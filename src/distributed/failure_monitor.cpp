#include "distributed/failure_monitor.h"

#include "detail/message_of.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <exception>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace gpipe {
namespace distributed {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::string lost_store_message(const Environment& environment, const std::string& error) {
  const std::string address =
      environment.master_addr + ":" + std::to_string(environment.master_port);
  if (environment.agent_store) {
    return "the store torchrun's agent serves at " + address +
           " is lost or frozen (did the agent stop?) [" + error + "]";
  }
  return "rank 0 failed: the store it serves at " + address +
         " is lost or frozen (did the process die or stop?) [" + error + "]";
}

FailureMonitor::FailureMonitor(const ProcessGroup& group, std::string keys,
                               std::chrono::milliseconds timeout,
                               std::chrono::milliseconds poll_interval,
                               std::function<void()> on_failure)
    : environment_(group.environment),
      keys_(std::move(keys)),
      timeout_(timeout),
      poll_interval_(poll_interval),
      on_failure_(std::move(on_failure)),
      store_(group.store, timeout) {
  watcher_ = std::thread([this] { watch(); });
}

FailureMonitor::~FailureMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_changed_.notify_all();
  watcher_.join();
}

std::string FailureMonitor::key(const std::string& name, int64_t rank) const {
  return keys_ + name + "/" + std::to_string(rank);
}

std::optional<std::string> FailureMonitor::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void FailureMonitor::explain_failed_wait(const std::string& what, int64_t peer,
                                         const std::string& error, bool timed_out) {
  // Another rank's failure may explain it (a failing rank records it before it exits): give
  // the watcher a moment, then look.
  const auto patience = Clock::now() + 4 * poll_interval_ + std::chrono::milliseconds(200);
  while (!failure() && Clock::now() < patience) {
    std::this_thread::sleep_for(poll_interval_ / 2);
  }
  try {
    if (!failure()) {
      if (auto found = lookup()) adopt(*found);
    }
    if (!failure()) {
      // A silent peer may itself wait for another: name the rank that stopped answering.
      std::string why;
      const int64_t silent = timed_out ? silent_rank(peer, why) : peer;
      std::ostringstream out;
      out << "rank " << silent << " failed: "
          << (timed_out ? "no answer within " + std::to_string(timeout_.count()) + " ms"
                        : std::string("connection lost (did the process die?)"))
          << why << " while rank " << environment_.rank << " waited for " << what << " [" << error
          << "]";
      record(out.str(), silent);
    }
  } catch (const std::exception& e) {
    adopt(lost_store_message(environment_, detail::message_of(e)));
  }
}

int64_t FailureMonitor::silent_rank(int64_t peer, std::string& why) {
  // Follow who waits for whom from `peer`: the first rank whose beat stands still has stopped;
  // else the first that waits for nobody hangs in its own code. Its waiters, and theirs, only
  // wait for it.
  auto read = [&] {
    std::vector<std::pair<int64_t, int64_t>> states;  // (beats, rank waited for or -1)
    for (const auto r : c10::irange(environment_.world_size)) {
      states.emplace_back(store_.add(key("alive", r), 0), store_.add(key("waiting", r), 0) - 1);
    }
    return states;
  };
  const auto window =
      std::max<std::chrono::milliseconds>(20 * poll_interval_, std::chrono::seconds(1));
  const auto before = read();
  std::this_thread::sleep_for(window);
  const auto after = read();
  std::set<int64_t> visited{environment_.rank};
  int64_t r = peer;
  while (true) {
    if (after[r].first == before[r].first) {
      why = " (it has not beaten in the store for " + std::to_string(window.count()) +
            " ms: stopped, frozen or cut off?)";
      return r;
    }
    visited.insert(r);
    const int64_t next = after[r].second;
    if (next < 0 || visited.count(next) != 0) break;
    r = next;
  }
  if (r != peer) why = " (rank " + std::to_string(peer) + " was waiting for it)";
  return r;
}

void FailureMonitor::barrier(const std::string& name, std::chrono::milliseconds timeout) {
  const std::string barrier_key = keys_ + "barrier/" + name;
  const auto deadline = Clock::now() + timeout;
  const int64_t world_size = environment_.world_size;
  auto add = [&](int64_t value) {
    try {
      return store_.add(barrier_key, value);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, lost_store_message(environment_, detail::message_of(e)), " while rank ",
                  environment_.rank, " waited for every rank to reach '", name, "'");
    }
  };
  add(1);
  for (int64_t came = add(0); came < world_size; came = add(0)) {
    TORCH_CHECK(Clock::now() < deadline, "rank ", environment_.rank, ": not every rank reached '",
                name, "' within ", timeout.count(), " ms (", came, " of ", world_size, " did)");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void FailureMonitor::close(bool failed) {
  const int64_t world_size = environment_.world_size;
  try {
    if (!failed) {
      store_.add(keys_ + "closed", 1);
      if (environment_.rank != 0) return;
      const auto closing = Clock::now() + timeout_;
      while (store_.add(keys_ + "closed", 0) < world_size && Clock::now() < closing) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return;
    }
    if (environment_.rank != 0) return;
    const auto deadline =
        Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(10));
    auto all_seen = [&] {
      for (const auto r : c10::irange(world_size)) {
        if (store_.add(key("seen", r), 0) == 0) return false;
      }
      return true;
    };
    while (!all_seen() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const std::exception&) {
    // Closing after a failure: nothing left to tell anyone.
  }
}

void FailureMonitor::record(const std::string& line, int64_t failed_peer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return;
    failure_ = line;
  }
  recorded_ = true;
  try {
    const int64_t n = store_.add(keys_ + "failures", 1);
    store_.set(key("failure", n), line);
    if (n > 1) {
      // Another rank recorded first: that is the failure every rank reports, once its line is
      // there (it counts, then writes it; a rank that died in between leaves only this one).
      const auto patience = Clock::now() + std::chrono::seconds(2);
      while (!store_.check(key("failure", 1)) && Clock::now() < patience) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (store_.check(key("failure", 1))) {
        std::string first = store_.get(key("failure", 1));
        std::lock_guard<std::mutex> lock(mutex_);
        failure_ = std::move(first);
      }
    }
    store_.add(key("seen", environment_.rank), 1);
    // A failed peer will not say it saw the failure: this rank says so for it.
    if (failed_peer >= 0) store_.add(key("seen", failed_peer), 1);
  } catch (const std::exception&) {
    // The store is gone with its server; the others find that out themselves.
  }
  on_failure_();
}

void FailureMonitor::report(const std::string& message) {
  if (recorded_) return;
  std::optional<std::string> first;
  try {
    // Another rank's failure first? Then this one is its consequence.
    first = lookup();
  } catch (const std::exception&) {
    return;  // the store is gone with its server, as every rank finds out
  }
  if (first) {
    adopt(*first);
    return;
  }
  record("rank " + std::to_string(environment_.rank) + " failed: " + message, /*failed_peer=*/-1);
}

std::optional<std::string> FailureMonitor::lookup() {
  if (store_.add(keys_ + "failures", 0) == 0) return std::nullopt;
  // The first rank to fail counts, then writes its line: until the line is there, there is no
  // failure to adopt yet. Waiting for it could wait for a rank that died in between.
  if (!store_.check(key("failure", 1))) return std::nullopt;
  return store_.get(key("failure", 1));
}

void FailureMonitor::adopt(const std::string& line) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return;
    failure_ = line;
  }
  try {
    store_.add(key("seen", environment_.rank), 1);
  } catch (const std::exception&) {
  }
  on_failure_();
}

void FailureMonitor::watch() {
  const std::string alive = key("alive", environment_.rank);
  const std::string waiting = key("waiting", environment_.rank);
  int64_t published = -1;  // the rank waited for, as the store has it
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    stop_changed_.wait_for(lock, poll_interval_, [this] { return stop_; });
    if (stop_ || failure_) continue;
    lock.unlock();
    try {
      store_.add(alive, 1);
      const int64_t now = waiting_for_;
      if (now != published) store_.add(waiting, now - published);
      published = now;
      if (auto found = lookup()) adopt(*found);
    } catch (const std::exception& e) {
      adopt(lost_store_message(environment_, detail::message_of(e)));
    }
    lock.lock();
  }
}

}  // namespace distributed
}  // namespace gpipe

// FailureMonitor: the failure protocol of the c10d transport (c10d_transport.h), over the store.
//
// A rank that fails records "rank R failed: <message>" in the store; the first recorded is the
// failure every rank reports. A watcher thread polls the store every poll_interval and, once
// any rank has failed, calls `on_failure` (the transport aborts its waits). The watcher also
// beats in the store and says whom its rank waits for, so that after a wait times out the
// waits can be followed to the rank that stopped answering: the first that stopped beating (a
// stopped or frozen process, or one cut off from the network), else the first that waits for
// nobody (it hangs in its own code).
// Every store call goes through a BoundedStore: a store that does not answer within the
// timeout, like one that is gone, is the failure of rank 0, which serves it (or, under torchrun,
// of the agent that does).
//
// Closing: without a failure every rank says it closed, and rank 0 stays until all have (it
// serves the store); after one, rank 0 stays until every rank has seen the failure, or they
// would blame the loss of the store on rank 0. Each rank says it saw a failure for itself, and
// the rank that records a dead or silent peer's failure says so for that peer.
//
// Keys, under the transport's prefix: "failures" (the count), "failure/<n>" (each line),
// "seen/<r>", "closed", "alive/<r>" (beats), "waiting/<r>" (the rank waited for, plus 1),
// "barrier/<name>". Counters (add) all but the lines, so reading never waits for a key.
//
// Thread safety: all methods may be called from any thread; `on_failure` runs on the caller's
// or the watcher's thread.
//
// Internal to the c10d transport.
#pragma once

#include "distributed/bounded_store.h"
#include "gpipe/distributed/rendezvous.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace gpipe {
namespace distributed {

/// What a lost or frozen store means, for a rank of `environment`: rank 0 failed (it serves the
/// store), or under torchrun the agent stopped. `error` is what the store call threw.
std::string lost_store_message(const Environment& environment, const std::string& error);

class FailureMonitor {
 public:
  /// Starts the watcher. `keys` prefixes every key; `timeout` bounds each store call, and is
  /// the timeout of the waits this monitor explains.
  FailureMonitor(const ProcessGroup& group, std::string keys, std::chrono::milliseconds timeout,
                 std::chrono::milliseconds poll_interval, std::function<void()> on_failure);
  /// Stops the watcher (close() first, to take part in the closing).
  ~FailureMonitor();

  /// The first failure recorded, once this rank knows of one.
  std::optional<std::string> failure() const;

  /// The rank this rank's worker now waits for (-1: none), published by the watcher.
  void set_waiting_for(int64_t rank) { waiting_for_ = rank; }

  /// After a wait of this rank for `peer` failed (`timed_out`, or the connection closed; the
  /// backend said `error` while waiting for `what`): records the failure of the rank that
  /// explains it, unless a failure is known by then. That is another rank's recorded failure,
  /// the peer (closed), the rank that stopped answering (timed out), or rank 0 if the store is
  /// lost. Calls on_failure.
  void explain_failed_wait(const std::string& what, int64_t peer, const std::string& error,
                           bool timed_out);

  /// Records that this rank failed with `message`, unless another rank's failure was recorded
  /// first (then this failure is its consequence). Calls on_failure.
  void report(const std::string& message);

  /// Waits until every rank has called barrier(name), at most `timeout`. Throws c10::Error
  /// saying how many ranks came, or naming rank 0 if the store is lost.
  void barrier(const std::string& name, std::chrono::milliseconds timeout);

  /// Takes part in the closing (above): `failed` when this rank knows of a failure or aborted.
  /// Never throws.
  void close(bool failed);

 private:
  void watch();
  // The first failure in the store, if any. Throws if the store is lost or frozen.
  std::optional<std::string> lookup();
  // Takes `line` as this rank's failure (another rank's, or the store's loss).
  void adopt(const std::string& line);
  // Writes `line` as a failure, unless one came first (then takes that one); `failed_peer`
  // (or -1) is the dead or silent rank it names, which will not say it saw it.
  void record(const std::string& line, int64_t failed_peer);
  // The rank that made a wait for `peer` time out; `why` says how it was found.
  int64_t silent_rank(int64_t peer, std::string& why);
  // The failure of rank 0 when its store is lost or frozen (`error`: what the call said).
  std::string key(const std::string& name, int64_t rank) const;

  Environment environment_;
  std::string keys_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds poll_interval_;
  std::function<void()> on_failure_;
  BoundedStore store_;
  std::atomic<int64_t> waiting_for_{-1};
  std::atomic<bool> recorded_{false};  // this rank recorded a failure

  mutable std::mutex mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;                   // guarded by mutex_
  std::optional<std::string> failure_;  // guarded by mutex_
  std::thread watcher_;
};

}  // namespace distributed
}  // namespace gpipe

// BoundedStore: calls to a c10d::Store that give up after a deadline.
//
// A TCPStore call blocks while the process that serves the store (rank 0) is stopped or frozen:
// LibTorch 2.x waits forever, 1.13 for the store's own timeout, the rendezvous timeout. So that
// a frozen rank 0 is named within the transport's timeout, every call runs on this object's own
// thread and the caller waits at most `patience`. A call that takes longer makes the store
// unresponsive for good: it and every later call throw StoreUnresponsive. The thread stuck in
// it is left behind on destruction (it holds the store and its own state, nothing else).
//
// Internal to the c10d transport (src/distributed/c10d_transport*.cpp).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace gpipe {
namespace distributed {

/// Thrown when the store does not answer within the patience.
struct StoreUnresponsive : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class BoundedStore {
 public:
  BoundedStore(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds patience);
  ~BoundedStore();
  BoundedStore(const BoundedStore&) = delete;
  BoundedStore& operator=(const BoundedStore&) = delete;

  /// As c10d::Store's. Throw StoreUnresponsive after the patience, or what the store threw (it
  /// lost its connection: the serving process is gone).
  int64_t add(const std::string& key, int64_t value);
  void set(const std::string& key, const std::string& value);
  /// The value of `key`, which must exist (Store::get waits for a missing key).
  std::string get(const std::string& key);
  /// Whether `key` exists, without waiting for it.
  bool check(const std::string& key);

  std::chrono::milliseconds patience() const { return patience_; }

 private:
  struct State;
  void call(std::function<void(c10d::Store&)> function);

  std::shared_ptr<State> state_;
  std::chrono::milliseconds patience_;
};

}  // namespace distributed
}  // namespace gpipe

#include "distributed/bounded_store.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

namespace gpipe {
namespace distributed {

// Shared by the object and its thread, so that a thread left behind in a call still has it.
struct BoundedStore::State {
  c10::intrusive_ptr<c10d::Store> store;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::packaged_task<void()>> calls;  // guarded by mutex
  bool stop = false;                             // guarded by mutex
  bool unresponsive = false;                     // guarded by mutex
  // When the call in progress started; calls queued behind it wait for it too.
  std::optional<std::chrono::steady_clock::time_point> busy_since;  // guarded by mutex
  std::thread thread;

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      changed.wait(lock, [&] { return stop || !calls.empty(); });
      if (calls.empty()) return;  // stopped, nothing left
      auto call = std::move(calls.front());
      calls.pop_front();
      busy_since = std::chrono::steady_clock::now();
      lock.unlock();
      call();  // its exception goes to its future
      lock.lock();
      busy_since.reset();
      changed.notify_all();  // for the destructor
    }
  }
};

BoundedStore::BoundedStore(c10::intrusive_ptr<c10d::Store> store,
                           std::chrono::milliseconds patience)
    : state_(std::make_shared<State>()), patience_(patience) {
  state_->store = std::move(store);
  state_->thread = std::thread([state = state_] { state->run(); });
}

BoundedStore::~BoundedStore() {
  bool stuck;
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->stop = true;
    state_->calls.clear();
    // A call in progress gets the rest of its patience to finish.
    const auto deadline = state_->busy_since.value_or(std::chrono::steady_clock::now()) + patience_;
    state_->changed.notify_all();
    state_->changed.wait_until(lock, deadline,
                               [&] { return state_->unresponsive || !state_->busy_since; });
    stuck = state_->unresponsive || state_->busy_since.has_value();
  }
  if (stuck) {
    state_->thread.detach();  // it may never come back from the store
  } else {
    state_->thread.join();
  }
}

void BoundedStore::call(std::function<void(c10d::Store&)> function) {
  std::packaged_task<void()> task(
      [state = state_, function = std::move(function)] { function(*state->store); });
  std::future<void> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->unresponsive || state_->stop) {
      throw StoreUnresponsive("did not answer within " + std::to_string(patience_.count()) + " ms");
    }
    state_->calls.push_back(std::move(task));
  }
  state_->changed.notify_all();
  // The store is unresponsive once this call, or the one in progress before it, has waited the
  // whole patience: a caller never waits longer than that after the store froze.
  const auto start = std::chrono::steady_clock::now();
  while (done.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto now = std::chrono::steady_clock::now();
    const auto since = state_->busy_since ? std::min(start, *state_->busy_since) : start;
    if (state_->unresponsive || now - since >= patience_) {
      state_->unresponsive = true;
      throw StoreUnresponsive("did not answer within " + std::to_string(patience_.count()) + " ms");
    }
  }
  done.get();  // rethrows the store's exception
}

// Results go through shared storage: a call given up on may still finish later.
int64_t BoundedStore::add(const std::string& key, int64_t value) {
  auto result = std::make_shared<int64_t>(0);
  call([result, key, value](c10d::Store& store) { *result = store.add(key, value); });
  return *result;
}

void BoundedStore::set(const std::string& key, const std::string& value) {
  call([key, value](c10d::Store& store) {
    store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
  });
}

std::string BoundedStore::get(const std::string& key) {
  auto result = std::make_shared<std::string>();
  call([result, key](c10d::Store& store) {
    const auto bytes = store.get(key);
    result->assign(bytes.begin(), bytes.end());
  });
  return *result;
}

bool BoundedStore::check(const std::string& key) {
  auto result = std::make_shared<bool>(false);
  call([result, key](c10d::Store& store) { *result = store.check({key}); });
  return *result;
}

}  // namespace distributed
}  // namespace gpipe

// The waits of the c10d transport (C10dTransport::Impl, c10d_transport_impl.h): every send and
// receive is posted and awaited here, so that abort() ends each wait, and a failed one names,
// through the failure monitor, the rank that explains it.
#include "distributed/c10d_transport_impl.h"

#include "detail/message_of.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <thread>

namespace gpipe {
namespace distributed {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void C10dTransport::Impl::wait(const c10::intrusive_ptr<c10d::Work>& work, const What& what,
                               int64_t peer) {
  bool was_aborted = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    was_aborted = aborted_;
    if (!aborted_) waiting_.push_back(work);
  }
  if (was_aborted) throw_failure("waiting for " + what());
  const auto start = Clock::now();
  monitor_->set_waiting_for(peer);  // to find a silent rank
  bool done = false;
  std::string error;
  try {
    if (device_.is_cpu()) {
      done = work->wait(options_.timeout());
    } else {
      // NCCL's wait only orders this thread's stream after the work: poll for completion on the
      // host, so that abort() and the timeout end the wait as they end Gloo's.
      const auto deadline = start + options_.timeout();
      while (!work->isCompleted() && !aborted() && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (work->isCompleted()) {
        done = work->wait();
      } else if (!aborted()) {
        error = "not completed on the GPU";  // timed out
      }
    }
  } catch (const std::exception& e) {
    error = detail::message_of(e);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  communication_seconds_ += seconds;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), work), waiting_.end());
  }
  if (done && error.empty()) {
    monitor_->set_waiting_for(-1);
    return;
  }
  // A failed wait still counts as waiting for `peer`: ranks that wait for this one, and look
  // for the silent rank meanwhile, follow it on to `peer`.
  if (!done && error.empty()) throw_failure("waiting for " + what());  // aborted
  peer_failed(what(), peer, error,
              seconds * 1000 >= 0.9 * static_cast<double>(options_.timeout().count()));
}

c10::intrusive_ptr<c10d::Work> C10dTransport::Impl::post(
    const std::function<c10::intrusive_ptr<c10d::Work>()>& start, const What& what, int64_t peer) {
  try {
    return start();
  } catch (const std::exception& e) {
    // Gloo refuses to post on a connection that is already closed.
    peer_failed(what(), peer, detail::message_of(e), /*timed_out=*/false);
  }
}

void C10dTransport::Impl::peer_failed(const std::string& what, int64_t peer,
                                      const std::string& error, bool timed_out) {
  monitor_->explain_failed_wait(what, peer, error, timed_out);
  throw_failure("waiting for " + what);
}

void C10dTransport::Impl::abort() {
  std::vector<c10::intrusive_ptr<c10d::Work>> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
    waiting = waiting_;
  }
  for (const auto& work : waiting) {
    try {
      work->abort();
    } catch (const std::exception&) {
      // Only sends and receives can be aborted; others end with the timeout.
    }
  }
}

void C10dTransport::Impl::throw_failure(const std::string& what) {
  std::optional<std::string> first = monitor_->failure();
  TORCH_CHECK(false, first ? *first : std::string("the transport was aborted"), " (rank ", rank(),
              " stopped ", what, ")");
}

bool C10dTransport::Impl::aborted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborted_;
}

}  // namespace distributed
}  // namespace gpipe

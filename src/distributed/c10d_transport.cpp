#include "gpipe/distributed/c10d_transport.h"

#include "detail/message_of.h"
#include "detail/stream.h"
#include "failure_monitor.h"
#include "wire_format.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <sstream>
#include <thread>
#include <tuple>

namespace gpipe {
namespace distributed {
namespace {

using Clock = std::chrono::steady_clock;

// A receive posted ahead, and the buffer it receives into.
struct PostedReceive {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor buffer;
};

// The tag of values between ranks (send_to_rank), after the edges' tags (edge_tag).
int value_tag(int64_t num_stages) { return static_cast<int>(2 * num_stages); }

// What a receive posted ahead waits for, in errors.
std::string next_message(int64_t from_stage, int64_t to_stage) {
  return "the next message from stage " + std::to_string(from_stage) + " to stage " +
         std::to_string(to_stage);
}

// What a message of `kind` on `lane` carries, in errors.
std::string message_name(int64_t kind, schedule::Lane lane) {
  if (lane == schedule::Lane::kPipeline) return kind_name(kind);
  return kind == kActivation ? "skip tensors" : "skip gradients";
}

}  // namespace

struct C10dTransport::Edge {
  std::optional<MessageMetadata> agreed;  // fixed by the edge's first message
  // The largest message so far on the edge, in bytes (0 before the first): the receiver posts
  // buffers of this size (at least a header's), and a batch that fits goes as one message.
  // Both ends keep it alike.
  int64_t send_capacity = 0;
  int64_t recv_capacity = 0;
  int64_t expected = 0;                 // messages still to come in this step (expect())
  std::optional<PostedReceive> posted;  // the receive of the next message, posted ahead
};

struct C10dTransport::State {
  std::map<std::tuple<int64_t, int64_t, schedule::Lane>, Edge> edges;  // (from, to, lane)
  // Activations sent per (from_stage, to_stage, lane, micro-batch): what their gradients must
  // look like.
  std::map<std::tuple<int64_t, int64_t, schedule::Lane, int64_t>, MessageMetadata> sent;
  std::map<int64_t, PostedReceive> posted_values;  // post_recv_from_rank, per rank
};

C10dTransport::C10dTransport(ProcessGroup group, int64_t num_stages, C10dTransportOptions options)
    : group_(std::move(group)),
      num_stages_(num_stages),
      options_(options),
      pipeline_size_(options.pipeline_size() > 0 ? options.pipeline_size() : group_.world_size()),
      device_(detail::normalize_device(options.device())),
      // Every rank makes its transports over a group in the same order, so the count names the
      // same transport on every rank and keeps its keys apart from earlier ones.
      keys_("gpipe/transport" + std::to_string(group_.transports ? (*group_.transports)++ : 0) +
            "/"),
      state_(std::make_unique<State>()) {
  TORCH_CHECK_VALUE(num_stages > 0, "num_stages must be positive, but got ", num_stages);
  TORCH_CHECK_VALUE(group_.world_size() % pipeline_size_ == 0, "pipelines of ", pipeline_size_,
                    " ranks do not divide WORLD_SIZE = ", group_.world_size());
  TORCH_CHECK_VALUE(
      options_.placement() != schedule::Placement::kV || num_stages == 2 * pipeline_size_,
      "the V placement runs 2 stages on each of ", pipeline_size_, " ranks, but got ", num_stages,
      " stages");
  TORCH_CHECK_VALUE(options_.timeout().count() > 0, "timeout must be positive, but got ",
                    options_.timeout().count(), " ms");
  TORCH_CHECK_VALUE(options_.poll_interval().count() > 0,
                    "poll_interval must be positive, but got ", options_.poll_interval().count(),
                    " ms");
  TORCH_CHECK_VALUE(device_.is_cpu() || device_.is_cuda(),
                    "the c10d transport moves CPU tensors (Gloo) or CUDA tensors (NCCL), not ",
                    device_, " tensors");
  TORCH_CHECK(device_.is_cpu() || nccl_available(), "rank ", rank(), " cannot move ", device_,
              " tensors: this gpipe was built with a LibTorch without NCCL (Debian's is CPU-only)");
  monitor_ = std::make_unique<FailureMonitor>(group_, keys_, options_.timeout(),
                                              options_.poll_interval(), [this] { abort(); });
}

C10dTransport::~C10dTransport() {
  bool failed = aborted();
  if (!failed) {
    try {
      flush();
    } catch (const std::exception&) {
      failed = true;  // it records the failure
    }
  }
  monitor_->close(failed);
}

C10dTransport::Edge& C10dTransport::edge(int64_t from_stage, int64_t to_stage,
                                         schedule::Lane lane) {
  const bool neighbours = to_stage == from_stage + 1 || to_stage + 1 == from_stage;
  TORCH_CHECK_INDEX(
      from_stage >= 0 && from_stage < num_stages_ && to_stage >= 0 && to_stage < num_stages_ &&
          from_stage != to_stage && (neighbours || lane == schedule::Lane::kSkip),
      "no edge from stage ", from_stage, " to stage ", to_stage, " among ", num_stages_, " stages");
  return state_->edges[{from_stage, to_stage, lane}];
}

Backend& C10dTransport::backend(const c10::Device& device, int tag) {
  if (device.is_cpu()) return *group_.group;
  auto& nccl = nccl_[tag];
  if (!nccl) {
    // NCCL's watchdog ends the process on its timeout: give the transport's own first say.
    nccl = new_nccl_backend(group_, keys_ + "tag" + std::to_string(tag), 2 * options_.timeout());
  }
  return *nccl;
}

int C10dTransport::edge_tag(int64_t from_stage, int64_t to_stage, schedule::Lane lane) const {
  // s -> s + 1 is 2s, s + 1 -> s is 2s + 1; 2 * num_stages carries values between ranks; the
  // skip lane's edges come after it.
  if (lane == schedule::Lane::kSkip) {
    return static_cast<int>(2 * num_stages_ + 1 + from_stage * num_stages_ + to_stage);
  }
  return static_cast<int>(to_stage > from_stage ? 2 * from_stage : 2 * to_stage + 1);
}

void C10dTransport::send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag,
                         schedule::Lane lane) {
  Edge& e = edge(from_stage, to_stage, lane);
  TORCH_CHECK_VALUE(rank_of(from_stage) == rank(), "rank ", rank(), " cannot send for stage ",
                    from_stage, ", which rank ", rank_of(from_stage), " runs");
  const int64_t kind = to_stage > from_stage ? kActivation : kGradient;
  std::ostringstream what;
  what << "the " << message_name(kind, lane) << " of micro-batch " << tag << " from stage "
       << from_stage << " to stage " << to_stage << " (rank " << rank_of(to_stage) << ")";
  check_not_failed("sending " + what.str());
  const MessageMetadata meta = metadata_of(batch);
  if (kind == kActivation) {
    if (!e.agreed) e.agreed = meta;
    TORCH_CHECK_VALUE(agrees(meta, *e.agreed, /*any_batch=*/true), "stage ", from_stage,
                      " sends to stage ", to_stage, " for micro-batch ", tag, " an activation ",
                      describe(meta), ", but the edge agreed on ", describe(*e.agreed, true),
                      " with its first message");
    state_->sent[{from_stage, to_stage, lane, tag}] = meta;
  } else {
    auto it = state_->sent.find({to_stage, from_stage, lane, tag});
    TORCH_INTERNAL_ASSERT(it != state_->sent.end(), "no activation of micro-batch ", tag,
                          " came to stage ", from_stage);
    TORCH_CHECK_VALUE(fits(meta, it->second), "stage ", from_stage, " sends to stage ", to_stage,
                      " for micro-batch ", tag, " a gradient ", describe(meta),
                      ", but the activation was ", describe(it->second));
    state_->sent.erase(it);
  }
  const int peer = static_cast<int>(rank_of(to_stage));
  const int t = edge_tag(from_stage, to_stage, lane);
  const auto start = Clock::now();
  for (const auto& x : batch) {
    TORCH_CHECK_VALUE(!x.defined() || x.device() == device_, "rank ", rank(),
                      "'s transport sends tensors on ", device_, ", but stage ", from_stage,
                      " sends one on ", x.device());
  }
  Backend& wire = backend(device_, t);
  // One message when it fits the buffer the receiver posts (both ends know its size), so that
  // a receive posted ahead takes the whole batch as soon as it is sent; else the header, then
  // one message per tensor.
  const MessageLayout layout = layout_of(meta);
  const bool one_message = layout.bytes <= e.send_capacity;
  e.send_capacity = std::max(e.send_capacity, layout.bytes);
  const at::Tensor header = encode(kind, tag, from_stage, to_stage, meta, one_message);
  if (one_message) {
    const auto copying = Clock::now();
    at::NoGradGuard no_grad;  // bytes to send, not part of any graph
    at::Tensor buffer = at::empty({layout.bytes}, at::TensorOptions(at::kByte).device(device_));
    buffer.narrow(0, 0, kHeaderBytes).view(at::kLong).copy_(header);
    for (const auto k : c10::irange(meta.dtypes.size())) {
      if (layout.offsets[k] < 0) continue;  // undefined
      view_bytes(buffer, layout.offsets[k], meta.dtypes[k], meta.shapes[k]).copy_(batch[k]);
    }
    transfer_seconds_ += std::chrono::duration<double>(Clock::now() - copying).count();
    std::vector<at::Tensor> message{buffer};
    ++messages_sent_;
    sends_.push_back(
        {post([&] { return wire.send(message, peer, t); }, what.str(), peer), peer, what.str()});
  } else {
    std::vector<at::Tensor> message{header.to(device_)};
    ++messages_sent_;
    sends_.push_back(
        {post([&] { return wire.send(message, peer, t); }, what.str(), peer), peer, what.str()});
    for (const auto& x : batch) {
      if (!x.defined() || x.numel() == 0) continue;
      std::vector<at::Tensor> payload{x.contiguous()};
      ++messages_sent_;
      sends_.push_back(
          {post([&] { return wire.send(payload, peer, t); }, what.str(), peer), peer, what.str()});
    }
  }
  communication_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
}

Batch C10dTransport::recv(int64_t from_stage, int64_t to_stage, int64_t tag, schedule::Lane lane) {
  Edge& e = edge(from_stage, to_stage, lane);
  TORCH_CHECK_VALUE(rank_of(to_stage) == rank(), "rank ", rank(), " cannot receive for stage ",
                    to_stage, ", which rank ", rank_of(to_stage), " runs");
  const int64_t kind = to_stage > from_stage ? kActivation : kGradient;
  const int64_t peer = rank_of(from_stage);
  std::ostringstream what;
  what << "the " << message_name(kind, lane) << " of micro-batch " << tag << " from stage "
       << from_stage << " (rank " << peer << ") to stage " << to_stage;
  check_not_failed("waiting for " + what.str());
  const int t = edge_tag(from_stage, to_stage, lane);
  if (!e.posted) post_receive(e, peer, t, what.str());
  const PostedReceive posted = std::move(*e.posted);
  e.posted.reset();
  if (e.expected > 0) --e.expected;
  wait(posted.work, what.str(), peer);
  const Header h = decode(posted.buffer.narrow(0, 0, kHeaderBytes).view(at::kLong), rank(), peer);
  TORCH_CHECK_VALUE(h.kind == kind && h.tag == tag && h.from == from_stage && h.to == to_stage,
                    "stage ", to_stage, " expected ", what.str(), ", but got the ",
                    kind_name(h.kind), " of micro-batch ", h.tag, " from stage ", h.from,
                    " to stage ", h.to);
  if (kind == kActivation) {
    if (!e.agreed) e.agreed = h.meta;
    TORCH_CHECK_VALUE(agrees(h.meta, *e.agreed, /*any_batch=*/true), "stage ", to_stage,
                      " received from stage ", from_stage, " for micro-batch ", tag,
                      " an activation ", describe(h.meta), ", but the edge agreed on ",
                      describe(*e.agreed, true), " with its first message");
    state_->sent[{from_stage, to_stage, lane, tag}] = h.meta;
  } else {
    auto it = state_->sent.find({to_stage, from_stage, lane, tag});
    TORCH_INTERNAL_ASSERT(it != state_->sent.end(), "stage ", to_stage, " sent no activation of ",
                          "micro-batch ", tag);
    TORCH_CHECK_VALUE(fits(h.meta, it->second), "stage ", to_stage, " received from stage ",
                      from_stage, " for micro-batch ", tag, " a gradient ", describe(h.meta),
                      ", but the activation was ", describe(it->second));
    state_->sent.erase(it);
  }
  const MessageLayout layout = layout_of(h.meta);
  std::vector<at::Tensor> tensors;
  for (const auto k : c10::irange(h.meta.dtypes.size())) {
    if (h.meta.dtypes[k] == kUndefined) {
      tensors.emplace_back();
      continue;
    }
    if (h.one_message) {
      tensors.push_back(
          view_bytes(posted.buffer, layout.offsets[k], h.meta.dtypes[k], h.meta.shapes[k]));
      continue;
    }
    at::Tensor x = at::empty(
        h.meta.shapes[k],
        at::TensorOptions(static_cast<c10::ScalarType>(h.meta.dtypes[k])).device(device_));
    if (x.numel() > 0) {
      std::vector<at::Tensor> payload{x};
      const double before = communication_seconds_;
      Backend& wire = backend(device_, t);
      wait(post([&] { return wire.recv(payload, static_cast<int>(peer), t); }, what.str(), peer),
           what.str(), peer);
      transfer_seconds_ += communication_seconds_ - before;
    }
    tensors.push_back(std::move(x));
  }
  e.recv_capacity = std::max(e.recv_capacity, layout.bytes);
  if (e.expected > 0) post_receive(e, peer, t, next_message(from_stage, to_stage));
  if (h.meta.atomic && tensors.size() == 1) return Batch(std::move(tensors[0]));
  return Batch(std::move(tensors));
}

void C10dTransport::post_receive(Edge& e, int64_t peer, int tag, const std::string& what) {
  std::vector<at::Tensor> buffer{at::empty({std::max(e.recv_capacity, kHeaderBytes)},
                                           at::TensorOptions(at::kByte).device(device_))};
  Backend& wire = backend(device_, tag);
  auto work = post([&] { return wire.recv(buffer, static_cast<int>(peer), tag); }, what, peer);
  e.posted = PostedReceive{std::move(work), buffer[0]};
}

void C10dTransport::expect(int64_t from_stage, int64_t to_stage, int64_t count) {
  TORCH_CHECK_VALUE(count >= 0, "count must be non-negative, but got ", count);
  TORCH_CHECK_VALUE(rank_of(to_stage) == rank(), "rank ", rank(), " cannot receive for stage ",
                    to_stage, ", which rank ", rank_of(to_stage), " runs");
  Edge& e = edge(from_stage, to_stage, schedule::Lane::kPipeline);
  e.expected = count;
  if (count > 0 && !e.posted) {
    post_receive(e, rank_of(from_stage), edge_tag(from_stage, to_stage, schedule::Lane::kPipeline),
                 next_message(from_stage, to_stage));
  }
}

void C10dTransport::flush() {
  std::vector<Send> sends;
  sends.swap(sends_);
  const double before = communication_seconds_;
  for (const auto& send : sends) wait(send.work, "the receipt of " + send.what, send.peer);
  transfer_seconds_ += communication_seconds_ - before;
}

void C10dTransport::begin_step() {
  for (auto& [key, e] : state_->edges) e.agreed.reset();
}

void C10dTransport::send_to_rank(at::Tensor value, int64_t to_rank) {
  const std::string what = "a value to rank " + std::to_string(to_rank);
  check_not_failed("sending " + what);
  const auto start = Clock::now();
  std::vector<at::Tensor> tensors{value.contiguous()};
  const int tag = value_tag(num_stages_);
  Backend& wire = backend(value.device(), tag);
  sends_.push_back(
      {post([&] { return wire.send(tensors, static_cast<int>(to_rank), tag); }, what, to_rank),
       to_rank, what});
  communication_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
}

void C10dTransport::post_recv_from_rank(int64_t from_rank, at::Tensor buffer) {
  const std::string what = "a value from rank " + std::to_string(from_rank);
  check_not_failed("waiting for " + what);
  TORCH_CHECK_VALUE(state_->posted_values.count(from_rank) == 0, "a receive from rank ", from_rank,
                    " is already posted");
  std::vector<at::Tensor> tensors{buffer};
  const int tag = value_tag(num_stages_);
  Backend& wire = backend(buffer.device(), tag);
  auto work =
      post([&] { return wire.recv(tensors, static_cast<int>(from_rank), tag); }, what, from_rank);
  state_->posted_values.emplace(from_rank, PostedReceive{std::move(work), std::move(buffer)});
}

at::Tensor C10dTransport::recv_from_rank(int64_t from_rank, at::Tensor buffer) {
  const std::string what = "a value from rank " + std::to_string(from_rank);
  check_not_failed("waiting for " + what);
  auto it = state_->posted_values.find(from_rank);
  if (it == state_->posted_values.end()) {
    post_recv_from_rank(from_rank, buffer);
    it = state_->posted_values.find(from_rank);
  }
  const PostedReceive posted = std::move(it->second);
  state_->posted_values.erase(it);
  wait(posted.work, what, from_rank);
  return posted.buffer;
}

void C10dTransport::wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what,
                         int64_t peer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) waiting_.push_back(work);
  }
  check_not_failed("waiting for " + what);
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
  if (!done && error.empty()) throw_failure("waiting for " + what);  // aborted
  peer_failed(what, peer, error,
              seconds * 1000 >= 0.9 * static_cast<double>(options_.timeout().count()));
}

c10::intrusive_ptr<c10d::Work> C10dTransport::post(
    const std::function<c10::intrusive_ptr<c10d::Work>()>& start, const std::string& what,
    int64_t peer) {
  try {
    return start();
  } catch (const std::exception& e) {
    // Gloo refuses to post on a connection that is already closed.
    peer_failed(what, peer, detail::message_of(e), /*timed_out=*/false);
  }
}

void C10dTransport::peer_failed(const std::string& what, int64_t peer, const std::string& error,
                                bool timed_out) {
  monitor_->explain_failed_wait(what, peer, error, timed_out);
  throw_failure("waiting for " + what);
}

void C10dTransport::barrier(const std::string& name, std::chrono::milliseconds timeout) {
  monitor_->barrier(name, timeout);
}

void C10dTransport::report_failure(const std::string& message) { monitor_->report(message); }

std::optional<std::string> C10dTransport::failure() const { return monitor_->failure(); }

void C10dTransport::abort() {
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

void C10dTransport::throw_failure(const std::string& what) {
  std::optional<std::string> first = failure();
  TORCH_CHECK(false, first ? *first : std::string("the transport was aborted"), " (rank ", rank(),
              " stopped ", what, ")");
}

void C10dTransport::check_not_failed(const std::string& what) {
  if (aborted()) throw_failure(what);
}

bool C10dTransport::aborted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborted_;
}

}  // namespace distributed
}  // namespace gpipe

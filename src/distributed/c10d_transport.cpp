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
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
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

// The largest batch that travels as one message, copied into it. A split batch's tensors travel
// uncopied, but only once the receiver asks for them: on the step's critical path. Below this,
// the copy (memory the allocator reuses, gpipe/cpu_malloc.h) costs less than that wait; above
// it, every buffer is a fresh mapping whose pages fault in as the copy writes them.
constexpr int64_t kMaxOneMessageBytes = 32 << 20;

// The tag of values between ranks (send_to_rank), after the edges' tags (edge_tag).
int value_tag(int64_t num_stages) { return static_cast<int>(2 * num_stages); }

// What a message of `kind` on `lane` carries, in errors.
std::string message_name(int64_t kind, schedule::Lane lane) {
  if (lane == schedule::Lane::kPipeline) return kind_name(kind);
  return kind == kActivation ? "skip tensors" : "skip gradients";
}

// A message of an edge, in errors, with the rank at its other end: "the activation of
// micro-batch 3 from stage 0 (rank 0) to stage 1" where it is received, "... from stage 0 to
// stage 1 (rank 1)" where it is sent; "the next message from stage 0 to stage 1" for a receive
// posted ahead (tag -1).
struct MessageName {
  int64_t kind;
  schedule::Lane lane;
  int64_t tag, from, to, peer;
  bool sending;

  std::string str() const {
    std::ostringstream out;
    if (tag < 0) {
      out << "the next message from stage " << from << " to stage " << to;
      return out.str();
    }
    out << "the " << message_name(kind, lane) << " of micro-batch " << tag << " from stage "
        << from;
    if (!sending) out << " (rank " << peer << ")";
    out << " to stage " << to;
    if (sending) out << " (rank " << peer << ")";
    return out.str();
  }
};

}  // namespace

struct C10dTransport::Edge {
  std::optional<MessageMetadata> agreed;  // fixed by the step's first message
  // Bytes of the one-message batches on the edge (kMaxOneMessageBytes at most), kept alike at
  // both ends: the largest so far, the largest before this step, and per message of this step
  // the largest up to it.
  int64_t capacity = 0;
  int64_t step_capacity = 0;
  std::vector<int64_t> step_max;
  int64_t messages = 0;  // on the edge so far
  int64_t window = 1;    // receives posted ahead at most, this step
  int64_t unposted = 0;  // announced receives not posted yet (expect())
  std::deque<PostedReceive> posted;  // in the order of the messages they take

  // The size of the buffer the receiver posted for the step's message `j`: it posted it once
  // message j - window had arrived (the first `window` when the step began), as large as the
  // largest message by then, and at least a header. A receive posted later, on demand, is no
  // smaller.
  int64_t posted_capacity(int64_t j) const {
    const int64_t known = j < window ? step_capacity : step_max[j - window];
    return std::max(known, kHeaderBytes);
  }
  // Records the step's next message, of `bytes`.
  void record(int64_t bytes) {
    ++messages;
    if (bytes <= kMaxOneMessageBytes) capacity = std::max(capacity, bytes);
    step_max.push_back(capacity);
  }
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

int C10dTransport::payload_tag(int edge_tag) const {
  // After every edge's tag (edge_tag) and the values' tag.
  return edge_tag + static_cast<int>(2 * num_stages_ + 1 + num_stages_ * num_stages_);
}

void C10dTransport::send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag,
                         schedule::Lane lane) {
  Edge& e = edge(from_stage, to_stage, lane);
  TORCH_CHECK_VALUE(rank_of(from_stage) == rank(), "rank ", rank(), " cannot send for stage ",
                    from_stage, ", which rank ", rank_of(from_stage), " runs");
  const int64_t kind = to_stage > from_stage ? kActivation : kGradient;
  const int peer = static_cast<int>(rank_of(to_stage));
  const MessageName name{kind, lane, tag, from_stage, to_stage, peer, /*sending=*/true};
  const What what = [name] { return name.str(); };
  if (aborted()) throw_failure("sending " + what());
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
  const int t = edge_tag(from_stage, to_stage, lane);
  const auto start = Clock::now();
  for (const auto& x : batch) {
    TORCH_CHECK_VALUE(!x.defined() || x.device() == device_, "rank ", rank(),
                      "'s transport sends tensors on ", device_, ", but stage ", from_stage,
                      " sends one on ", x.device());
  }
  Backend& wire = backend(device_, t);
  // One message when it fits the buffer the receiver posted for it, so that it lands as soon as
  // it is sent; else the header, then one message per tensor on the payload tag.
  const MessageLayout layout = layout_of(meta);
  const bool one_message =
      layout.bytes <= e.posted_capacity(static_cast<int64_t>(e.step_max.size()));
  e.record(layout.bytes);
  const auto send = [&](at::Tensor message, int on_tag) {
    std::vector<at::Tensor> tensors{std::move(message)};
    ++messages_sent_;
    sends_.push_back({post([&] { return wire.send(tensors, peer, on_tag); }, what, peer), peer,
                      what});
  };
  if (one_message) {
    const auto copying = Clock::now();
    at::NoGradGuard no_grad;  // bytes to send, not part of any graph
    at::Tensor buffer = at::empty({layout.bytes}, at::TensorOptions(at::kByte).device(device_));
    if (device_.is_cpu()) {
      auto* bytes = static_cast<uint8_t*>(buffer.data_ptr());
      encode(kind, tag, from_stage, to_stage, meta, true, reinterpret_cast<int64_t*>(bytes));
      for (const auto k : c10::irange(meta.dtypes.size())) {
        const at::Tensor& x = batch[k];
        if (layout.offsets[k] < 0 || x.numel() == 0) continue;  // undefined or no bytes
        if (x.is_contiguous() && !x.is_conj() && !x.is_neg()) {
          std::memcpy(bytes + layout.offsets[k], x.data_ptr(), x.nbytes());
        } else {
          view_bytes(buffer, layout.offsets[k], meta.dtypes[k], meta.shapes[k]).copy_(x);
        }
      }
    } else {
      buffer.narrow(0, 0, kHeaderBytes)
          .copy_(encode(kind, tag, from_stage, to_stage, meta, true).view(at::kByte));
      for (const auto k : c10::irange(meta.dtypes.size())) {
        if (layout.offsets[k] < 0) continue;  // undefined
        view_bytes(buffer, layout.offsets[k], meta.dtypes[k], meta.shapes[k]).copy_(batch[k]);
      }
    }
    transfer_seconds_ += std::chrono::duration<double>(Clock::now() - copying).count();
    send(std::move(buffer), t);
  } else {
    send(encode(kind, tag, from_stage, to_stage, meta, false).view(at::kByte).to(device_), t);
    for (const auto& x : batch) {
      if (x.defined() && x.numel() > 0) send(x.contiguous(), payload_tag(t));
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
  const MessageName name{kind, lane, tag, from_stage, to_stage, peer, /*sending=*/false};
  const What what = [name] { return name.str(); };
  if (aborted()) throw_failure("waiting for " + what());
  if (e.posted.empty()) {
    ++e.unposted;  // this one, on demand
    post_receive(e, from_stage, to_stage, lane);
  }
  const PostedReceive posted = std::move(e.posted.front());
  e.posted.pop_front();
  wait(posted.work, what, peer);
  const Header h = decode(posted.buffer, rank(), peer);
  TORCH_CHECK_VALUE(h.kind == kind && h.tag == tag && h.from == from_stage && h.to == to_stage,
                    "stage ", to_stage, " expected ", what(), ", but got the ", kind_name(h.kind),
                    " of micro-batch ", h.tag, " from stage ", h.from, " to stage ", h.to);
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
  e.record(layout.bytes);
  // The next receive goes out before this batch's own tensors are taken: it holds the next batch.
  post_receives(e, from_stage, to_stage, lane);
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
      const int t = payload_tag(edge_tag(from_stage, to_stage, lane));
      Backend& wire = backend(device_, t);
      wait(post([&] { return wire.recv(payload, static_cast<int>(peer), t); }, what, peer), what,
           peer);
      transfer_seconds_ += communication_seconds_ - before;
    }
    tensors.push_back(std::move(x));
  }
  if (h.meta.atomic && tensors.size() == 1) return Batch(std::move(tensors[0]));
  return Batch(std::move(tensors));
}

void C10dTransport::post_receive(Edge& e, int64_t from_stage, int64_t to_stage,
                                 schedule::Lane lane) {
  const int64_t peer = rank_of(from_stage);
  const MessageName name{to_stage > from_stage ? kActivation : kGradient,
                         lane,
                         /*tag=*/-1,
                         from_stage,
                         to_stage,
                         peer,
                         /*sending=*/false};
  std::vector<at::Tensor> buffer{at::empty({std::max(e.capacity, kHeaderBytes)},
                                           at::TensorOptions(at::kByte).device(device_))};
  const int tag = edge_tag(from_stage, to_stage, lane);
  Backend& wire = backend(device_, tag);
  auto work = post([&] { return wire.recv(buffer, static_cast<int>(peer), tag); },
                   [name] { return name.str(); }, peer);
  e.posted.push_back(PostedReceive{std::move(work), buffer[0]});
  --e.unposted;
}

void C10dTransport::post_receives(Edge& e, int64_t from_stage, int64_t to_stage,
                                  schedule::Lane lane) {
  while (e.unposted > 0 && static_cast<int64_t>(e.posted.size()) < e.window) {
    post_receive(e, from_stage, to_stage, lane);
  }
}

void C10dTransport::expect(int64_t from_stage, int64_t to_stage, int64_t count,
                           schedule::Lane lane) {
  TORCH_CHECK_VALUE(count >= 0, "count must be non-negative, but got ", count);
  TORCH_CHECK_VALUE(rank_of(to_stage) == rank(), "rank ", rank(), " cannot receive for stage ",
                    to_stage, ", which rank ", rank_of(to_stage), " runs");
  Edge& e = edge(from_stage, to_stage, lane);
  // Receives already posted take the first of them.
  e.unposted = std::max<int64_t>(0, count - static_cast<int64_t>(e.posted.size()));
  post_receives(e, from_stage, to_stage, lane);
}

void C10dTransport::flush() {
  std::vector<Send> sends;
  sends.swap(sends_);
  const double before = communication_seconds_;
  for (const auto& send : sends) {
    wait(send.work, [&send] { return "the receipt of " + send.what(); }, send.peer);
  }
  transfer_seconds_ += communication_seconds_ - before;
}

void C10dTransport::begin_step() {
  const int64_t window =
      options_.receive_window() > 0 ? options_.receive_window() : std::numeric_limits<int64_t>::max();
  for (const auto& [key, e] : state_->edges) {
    const auto& [from, to, lane] = key;
    TORCH_CHECK_VALUE(e.posted.empty(), "rank ", rank(), " announced more messages from stage ",
                      from, " to stage ", to, " in the last step than came: ", e.posted.size(),
                      " receive(s) still posted");
  }
  for (auto& [key, e] : state_->edges) {
    e.agreed.reset();
    e.step_capacity = e.capacity;
    e.step_max.clear();
    e.unposted = 0;
    // On the edge's first step its buffers' size is learnt message by message.
    e.window = e.messages == 0 ? 1 : window;
  }
}

void C10dTransport::send_to_rank(at::Tensor value, int64_t to_rank) {
  const What what = [to_rank] { return "a value to rank " + std::to_string(to_rank); };
  if (aborted()) throw_failure("sending " + what());
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
  const What what = [from_rank] { return "a value from rank " + std::to_string(from_rank); };
  if (aborted()) throw_failure("waiting for " + what());
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
  const What what = [from_rank] { return "a value from rank " + std::to_string(from_rank); };
  if (aborted()) throw_failure("waiting for " + what());
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

void C10dTransport::wait(const c10::intrusive_ptr<c10d::Work>& work, const What& what,
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

c10::intrusive_ptr<c10d::Work> C10dTransport::post(
    const std::function<c10::intrusive_ptr<c10d::Work>()>& start, const What& what, int64_t peer) {
  try {
    return start();
  } catch (const std::exception& e) {
    // Gloo refuses to post on a connection that is already closed.
    peer_failed(what(), peer, detail::message_of(e), /*timed_out=*/false);
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

bool C10dTransport::aborted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborted_;
}

}  // namespace distributed
}  // namespace gpipe

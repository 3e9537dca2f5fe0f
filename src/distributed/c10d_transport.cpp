#include "gpipe/distributed/c10d_transport.h"

#include "bounded_store.h"
#include "gpipe/stream.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

namespace gpipe {
namespace distributed {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kHeaderSize = 256;
constexpr int64_t kHeaderBytes = kHeaderSize * static_cast<int64_t>(sizeof(int64_t));
constexpr int64_t kAlignment = 64;      // of each tensor in a one-message batch
constexpr int64_t kMagic = 0x67706970;  // "gpip"
constexpr int64_t kUndefined = -1;      // the dtype of an undefined tensor

enum MessageKind : int64_t { kActivation = 0, kGradient = 1, kValue = 2 };

const char* kind_name(int64_t kind) {
  switch (kind) {
    case kActivation:
      return "activation";
    case kGradient:
      return "gradient";
    case kValue:
      return "value";
  }
  return "unknown message";
}

// Store keys, under the transport's prefix: the failure count, the failures in order, per rank
// whether it saw one, how many closed; per rank its heartbeat and the rank it waits for, plus 1
// (0: none). Counters (add) all, so that reading a key never waits for it to be written.
const std::string kFailures = "failures";
const std::string kFailurePrefix = "failure/";
const std::string kSeenPrefix = "seen/";
const std::string kClosed = "closed";
const std::string kAlivePrefix = "alive/";
const std::string kWaitingPrefix = "waiting/";

MessageMetadata metadata_of(const Batch& batch) {
  MessageMetadata meta;
  meta.atomic = batch.atomic();
  for (const auto& t : batch) {
    meta.dtypes.push_back(t.defined() ? static_cast<int64_t>(t.scalar_type()) : kUndefined);
    meta.shapes.push_back(t.defined() ? t.sizes().vec() : std::vector<int64_t>{});
  }
  return meta;
}

// E.g. "(Float[2, 8], Long[2])"; with `any_batch`, the first dimension prints as *.
std::string describe(const MessageMetadata& meta, bool any_batch = false) {
  std::ostringstream out;
  out << "(";
  for (const auto k : c10::irange(meta.dtypes.size())) {
    if (k > 0) out << ", ";
    if (meta.dtypes[k] == kUndefined) {
      out << "undefined";
      continue;
    }
    out << c10::toString(static_cast<c10::ScalarType>(meta.dtypes[k])) << "[";
    for (const auto d : c10::irange(meta.shapes[k].size())) {
      if (d > 0) out << ", ";
      if (d == 0 && any_batch) {
        out << "*";
      } else {
        out << meta.shapes[k][d];
      }
    }
    out << "]";
  }
  out << ")";
  return out.str();
}

// Same tensors, dtypes and shapes but (with any_batch) the first dimension.
bool agrees(const MessageMetadata& a, const MessageMetadata& b, bool any_batch) {
  if (a.atomic != b.atomic || a.dtypes != b.dtypes) return false;
  for (const auto k : c10::irange(a.shapes.size())) {
    const auto& x = a.shapes[k];
    const auto& y = b.shapes[k];
    if (x.size() != y.size()) return false;
    for (const auto d : c10::irange(x.size())) {
      if ((d > 0 || !any_batch) && x[d] != y[d]) return false;
    }
  }
  return true;
}

// A gradient matches its activation: each tensor undefined or of the activation's dtype and shape.
bool fits(const MessageMetadata& grad, const MessageMetadata& activation) {
  if (grad.dtypes.size() != activation.dtypes.size()) return false;
  for (const auto k : c10::irange(grad.dtypes.size())) {
    if (grad.dtypes[k] == kUndefined) continue;
    if (grad.dtypes[k] != activation.dtypes[k] || grad.shapes[k] != activation.shapes[k]) {
      return false;
    }
  }
  return true;
}

// Where a batch's tensors sit in its one message: after the header, each defined tensor's data
// at a 64-byte-aligned offset (-1 for an undefined tensor); `bytes` in all. Sender and receiver
// compute it alike from the metadata.
struct MessageLayout {
  std::vector<int64_t> offsets;
  int64_t bytes = kHeaderBytes;
};

MessageLayout layout_of(const MessageMetadata& meta) {
  MessageLayout layout;
  for (const auto k : c10::irange(meta.dtypes.size())) {
    if (meta.dtypes[k] == kUndefined) {
      layout.offsets.push_back(-1);
      continue;
    }
    layout.offsets.push_back(layout.bytes);
    const int64_t size =
        c10::multiply_integers(meta.shapes[k]) *
        static_cast<int64_t>(c10::elementSize(static_cast<c10::ScalarType>(meta.dtypes[k])));
    layout.bytes += (size + kAlignment - 1) / kAlignment * kAlignment;
  }
  return layout;
}

// The tag of values between ranks (send_to_rank), after the edges' tags (edge_tag).
int value_tag(int64_t num_stages) { return static_cast<int>(2 * num_stages); }

// What a receive posted ahead waits for, in errors.
std::string next_message(int64_t from_stage, int64_t to_stage) {
  return "the next message from stage " + std::to_string(from_stage) + " to stage " +
         std::to_string(to_stage);
}

// The bytes of `buffer` at `offset` as a tensor of `dtype` and `shape` (a view, no copy).
at::Tensor view_bytes(const at::Tensor& buffer, int64_t offset, int64_t dtype,
                      const std::vector<int64_t>& shape) {
  const auto type = static_cast<c10::ScalarType>(dtype);
  const int64_t numel = c10::multiply_integers(shape);
  const int64_t size = numel * static_cast<int64_t>(c10::elementSize(type));
  return buffer.narrow(0, offset, size).view(type).view(shape);
}

at::Tensor encode(int64_t kind, int64_t tag, int64_t from, int64_t to, const MessageMetadata& meta,
                  bool one_message) {
  std::vector<int64_t> h{kMagic,
                         kind,
                         tag,
                         from,
                         to,
                         meta.atomic ? 1 : 0,
                         static_cast<int64_t>(meta.dtypes.size()),
                         one_message ? 1 : 0};
  for (const auto k : c10::irange(meta.dtypes.size())) {
    h.push_back(meta.dtypes[k]);
    h.push_back(static_cast<int64_t>(meta.shapes[k].size()));
    h.insert(h.end(), meta.shapes[k].begin(), meta.shapes[k].end());
  }
  TORCH_CHECK_VALUE(static_cast<int64_t>(h.size()) <= kHeaderSize, "stage ", from,
                    " cannot send the metadata of ", meta.dtypes.size(), " tensors ",
                    describe(meta), " to stage ", to, ": it needs ", h.size(),
                    " header entries, but a header holds ", kHeaderSize);
  h.resize(kHeaderSize, 0);
  return at::tensor(h, at::kLong);
}

struct Header {
  int64_t kind, tag, from, to;
  MessageMetadata meta;
  bool one_message;  // the tensors' data follows the header in the same message
};

Header decode(const at::Tensor& received, int64_t rank, int64_t peer) {
  const at::Tensor tensor = received.to(at::kCPU);  // a NCCL message's header is on its GPU
  const int64_t* h = tensor.data_ptr<int64_t>();
  TORCH_CHECK_VALUE(h[0] == kMagic, "rank ", rank, " received a message from rank ", peer,
                    " that is not a gpipe header: is rank ", peer, " running the same program?");
  Header header{h[1], h[2], h[3], h[4], {}, h[7] != 0};
  header.meta.atomic = h[5] != 0;
  int64_t at = 8;
  for (int64_t k = 0; k < h[6] && at + 1 < kHeaderSize; ++k) {
    header.meta.dtypes.push_back(h[at]);
    const int64_t ndim = h[at + 1];
    at += 2;
    TORCH_CHECK_VALUE(ndim >= 0 && at + ndim <= kHeaderSize, "corrupt header from rank ", peer);
    header.meta.shapes.emplace_back(h + at, h + at + ndim);
    at += ndim;
  }
  return header;
}

}  // namespace

C10dTransport::C10dTransport(ProcessGroup group, int64_t num_stages, C10dTransportOptions options)
    : group_(std::move(group)),
      num_stages_(num_stages),
      options_(options),
      pipeline_size_(options.pipeline_size() > 0 ? options.pipeline_size() : group_.world_size()),
      device_(detail::normalize_device(options.device())),
      // Every rank makes its transports over a group in the same order, so the count names the
      // same transport on every rank and keeps its keys apart from earlier ones.
      keys_("gpipe/transport" + std::to_string(group_.transports ? (*group_.transports)++ : 0) +
            "/") {
  TORCH_CHECK_VALUE(num_stages > 0, "num_stages must be positive, but got ", num_stages);
  TORCH_CHECK_VALUE(group_.world_size() % pipeline_size_ == 0, "pipelines of ", pipeline_size_,
                    " ranks do not divide WORLD_SIZE = ", group_.world_size());
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
  store_ = std::make_unique<BoundedStore>(group_.store, options_.timeout());
  watcher_ = std::thread([this] { watch(); });
}

C10dTransport::~C10dTransport() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_changed_.notify_all();
  watcher_.join();
  const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(
                                           options_.timeout(), std::chrono::seconds(10));
  try {
    if (!failure_ && !aborted_) {
      flush();
      // Rank 0 serves the store: it stays until every rank has closed.
      store_->add(keys_ + kClosed, 1);
      if (rank() == 0) {
        const auto closing = Clock::now() + options_.timeout();
        while (store_->add(keys_ + kClosed, 0) < world_size() && Clock::now() < closing) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
    } else if (rank() == 0) {
      // Keep the store until every other rank has seen the failure, or they would blame rank 0.
      // Each rank says so for itself, and the rank that recorded a dead or silent peer for it.
      auto all_seen = [&] {
        for (const auto r : c10::irange(world_size())) {
          if (store_->add(keys_ + kSeenPrefix + std::to_string(r), 0) == 0) return false;
        }
        return true;
      };
      while (!all_seen() && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  } catch (const std::exception&) {
    // Closing after a failure: nothing left to tell anyone.
  }
}

C10dTransport::Edge& C10dTransport::edge(int64_t from_stage, int64_t to_stage) {
  TORCH_CHECK_INDEX(
      from_stage >= 0 && from_stage < num_stages_ && to_stage >= 0 && to_stage < num_stages_ &&
          (to_stage == from_stage + 1 || to_stage + 1 == from_stage),
      "no edge from stage ", from_stage, " to stage ", to_stage, " among ", num_stages_, " stages");
  return edges_[{from_stage, to_stage}];
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

int C10dTransport::edge_tag(int64_t from_stage, int64_t to_stage) const {
  // s -> s + 1 is 2s, s + 1 -> s is 2s + 1; 2 * num_stages carries values between ranks.
  return static_cast<int>(to_stage > from_stage ? 2 * from_stage : 2 * to_stage + 1);
}

void C10dTransport::send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag) {
  Edge& e = edge(from_stage, to_stage);
  TORCH_CHECK_VALUE(rank_of(from_stage) == rank(), "rank ", rank(), " cannot send for stage ",
                    from_stage, ", which rank ", rank_of(from_stage), " runs");
  const int64_t kind = to_stage > from_stage ? kActivation : kGradient;
  std::ostringstream what;
  what << "the " << kind_name(kind) << " of micro-batch " << tag << " from stage " << from_stage
       << " to stage " << to_stage << " (rank " << rank_of(to_stage) << ")";
  check_not_failed("sending " + what.str());
  const MessageMetadata meta = metadata_of(batch);
  if (kind == kActivation) {
    if (!e.agreed) e.agreed = meta;
    TORCH_CHECK_VALUE(agrees(meta, *e.agreed, /*any_batch=*/true), "stage ", from_stage,
                      " sends to stage ", to_stage, " for micro-batch ", tag, " an activation ",
                      describe(meta), ", but the edge agreed on ", describe(*e.agreed, true),
                      " with its first message");
    sent_[{to_stage, tag}] = meta;
  } else {
    auto it = sent_.find({from_stage, tag});
    TORCH_INTERNAL_ASSERT(it != sent_.end(), "no activation of micro-batch ", tag,
                          " came to stage ", from_stage);
    TORCH_CHECK_VALUE(fits(meta, it->second), "stage ", from_stage, " sends to stage ", to_stage,
                      " for micro-batch ", tag, " a gradient ", describe(meta),
                      ", but the activation was ", describe(it->second));
    sent_.erase(it);
  }
  const int peer = static_cast<int>(rank_of(to_stage));
  const int t = edge_tag(from_stage, to_stage);
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

Batch C10dTransport::recv(int64_t from_stage, int64_t to_stage, int64_t tag) {
  Edge& e = edge(from_stage, to_stage);
  TORCH_CHECK_VALUE(rank_of(to_stage) == rank(), "rank ", rank(), " cannot receive for stage ",
                    to_stage, ", which rank ", rank_of(to_stage), " runs");
  const int64_t kind = to_stage > from_stage ? kActivation : kGradient;
  const int64_t peer = rank_of(from_stage);
  std::ostringstream what;
  what << "the " << kind_name(kind) << " of micro-batch " << tag << " from stage " << from_stage
       << " (rank " << peer << ") to stage " << to_stage;
  check_not_failed("waiting for " + what.str());
  const int t = edge_tag(from_stage, to_stage);
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
    sent_[{to_stage, tag}] = h.meta;
  } else {
    auto it = sent_.find({from_stage, tag});
    TORCH_INTERNAL_ASSERT(it != sent_.end(), "stage ", to_stage, " sent no activation of ",
                          "micro-batch ", tag);
    TORCH_CHECK_VALUE(fits(h.meta, it->second), "stage ", to_stage, " received from stage ",
                      from_stage, " for micro-batch ", tag, " a gradient ", describe(h.meta),
                      ", but the activation was ", describe(it->second));
    sent_.erase(it);
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
  Edge& e = edge(from_stage, to_stage);
  e.expected = count;
  if (count > 0 && !e.posted) {
    post_receive(e, rank_of(from_stage), edge_tag(from_stage, to_stage),
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
  for (auto& [key, e] : edges_) e.agreed.reset();
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
  TORCH_CHECK_VALUE(posted_values_.count(from_rank) == 0, "a receive from rank ", from_rank,
                    " is already posted");
  std::vector<at::Tensor> tensors{buffer};
  const int tag = value_tag(num_stages_);
  Backend& wire = backend(buffer.device(), tag);
  auto work =
      post([&] { return wire.recv(tensors, static_cast<int>(from_rank), tag); }, what, from_rank);
  posted_values_.emplace(from_rank, PostedReceive{std::move(work), std::move(buffer)});
}

at::Tensor C10dTransport::recv_from_rank(int64_t from_rank, at::Tensor buffer) {
  const std::string what = "a value from rank " + std::to_string(from_rank);
  check_not_failed("waiting for " + what);
  auto it = posted_values_.find(from_rank);
  if (it == posted_values_.end()) {
    post_recv_from_rank(from_rank, buffer);
    it = posted_values_.find(from_rank);
  }
  const PostedReceive posted = std::move(it->second);
  posted_values_.erase(it);
  wait(posted.work, what, from_rank);
  return posted.buffer;
}

void C10dTransport::wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what,
                         int64_t peer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_ && !aborted_) waiting_.push_back(work);
  }
  check_not_failed("waiting for " + what);
  const auto start = Clock::now();
  waiting_for_ = peer;  // published by the watcher, to find a silent rank (silent_rank)
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
    error = e.what();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  communication_seconds_ += seconds;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), work), waiting_.end());
  }
  if (done && error.empty()) {
    waiting_for_ = -1;
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
    peer_failed(what, peer, e.what(), /*timed_out=*/false);
  }
}

void C10dTransport::peer_failed(const std::string& what, int64_t peer, const std::string& error,
                                bool timed_out) {
  // Gloo failed: the peer closed its connections or stayed silent. Another rank's failure may
  // explain it (a failing rank records it before it exits): give the watcher a moment, then look.
  const auto patience =
      Clock::now() + 4 * options_.poll_interval() + std::chrono::milliseconds(200);
  while (!failure() && Clock::now() < patience) {
    std::this_thread::sleep_for(options_.poll_interval() / 2);
  }
  std::optional<std::string> line;
  try {
    if (!failure()) {
      if (auto found = lookup_failure()) adopt_failure(*found);
    }
    if (!failure()) {
      // A silent peer may itself wait for another: name the rank that stopped answering.
      std::string why;
      const int64_t silent = timed_out ? silent_rank(peer, why) : peer;
      std::ostringstream out;
      out << "rank " << silent << " failed: "
          << (timed_out ? "no answer within " + std::to_string(options_.timeout().count()) + " ms"
                        : std::string("connection lost (did the process die?)"))
          << why << " while rank " << rank() << " waited for " << what << " [" << error << "]";
      record_failure(out.str(), silent);
    }
  } catch (const StoreUnresponsive& e) {
    adopt_failure(store_failure(e.what()));
  } catch (const std::exception& e) {
    adopt_failure(store_failure(e.what()));
  }
  throw_failure("waiting for " + what);
}

int64_t C10dTransport::silent_rank(int64_t peer, std::string& why) {
  // Each rank's watcher beats every poll_interval while its process runs, and says whom its
  // worker waits for. Follow that from `peer`: the first rank whose beat stands still has
  // stopped (SIGSTOP, a frozen machine); else the first that waits for nobody hangs in its own
  // code. Its waiters, and theirs, only wait for it.
  auto read = [&] {
    std::vector<std::pair<int64_t, int64_t>> states;  // (beats, rank waited for or -1)
    for (const auto r : c10::irange(world_size())) {
      const std::string suffix = std::to_string(r);
      states.emplace_back(store_->add(keys_ + kAlivePrefix + suffix, 0),
                          store_->add(keys_ + kWaitingPrefix + suffix, 0) - 1);
    }
    return states;
  };
  const auto window =
      std::max<std::chrono::milliseconds>(20 * options_.poll_interval(), std::chrono::seconds(1));
  const auto before = read();
  std::this_thread::sleep_for(window);
  const auto after = read();
  std::set<int64_t> visited{rank()};
  int64_t r = peer;
  while (true) {
    if (after[r].first == before[r].first) {
      why = " (its process has not run for " + std::to_string(window.count()) +
            " ms: stopped or frozen?)";
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

std::string C10dTransport::store_failure(const std::string& error) const {
  return "rank 0 failed: the store it serves at " + group_.environment.master_addr + ":" +
         std::to_string(group_.environment.master_port) +
         " is lost or frozen (did the process die or stop?) [" + error + "]";
}

void C10dTransport::barrier(const std::string& name, std::chrono::milliseconds timeout) {
  const std::string key = keys_ + "barrier/" + name;
  const auto deadline = Clock::now() + timeout;
  try {
    store_->add(key, 1);
    while (store_->add(key, 0) < world_size()) {
      TORCH_CHECK(Clock::now() < deadline, "rank ", rank(), ": not every rank reached '", name,
                  "' within ", timeout.count(), " ms (", store_->add(key, 0), " of ", world_size(),
                  " did)");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, store_failure(e.what()), " while rank ", rank(),
                " waited for every rank to reach '", name, "'");
  }
}

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
  bool failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed = failure_.has_value() || aborted_;
  }
  if (failed) throw_failure(what);
}

bool C10dTransport::aborted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborted_ || failure_.has_value();
}

std::optional<std::string> C10dTransport::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void C10dTransport::record_failure(const std::string& line, int64_t failed_peer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return;
    failure_ = line;
  }
  reported_ = true;
  try {
    const int64_t n = store_->add(keys_ + kFailures, 1);
    store_->set(keys_ + kFailurePrefix + std::to_string(n), line);
    if (n > 1) {
      // Another rank recorded first: that is the failure every rank reports.
      std::string first = store_->get(keys_ + kFailurePrefix + "1");
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = std::move(first);
    }
    store_->add(keys_ + kSeenPrefix + std::to_string(rank()), 1);
    // A failed peer will not say it saw the failure: this rank says so for it.
    if (failed_peer >= 0) store_->add(keys_ + kSeenPrefix + std::to_string(failed_peer), 1);
  } catch (const std::exception&) {
    // The store is gone with rank 0; the others find that out themselves.
  }
  abort();
}

void C10dTransport::report_failure(const std::string& message) {
  if (reported_) return;
  std::optional<std::string> first;
  try {
    // Another rank's failure first? Then this one is its consequence.
    first = lookup_failure();
  } catch (const std::exception&) {
    return;  // the store is gone: rank 0 failed, as every rank finds out
  }
  if (first) {
    adopt_failure(*first);
    return;
  }
  record_failure("rank " + std::to_string(rank()) + " failed: " + message, /*failed_peer=*/-1);
}

std::optional<std::string> C10dTransport::lookup_failure() {
  if (store_->add(keys_ + kFailures, 0) == 0) return std::nullopt;
  return store_->get(keys_ + kFailurePrefix + "1");
}

void C10dTransport::adopt_failure(const std::string& line) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return;
    failure_ = line;
  }
  try {
    store_->add(keys_ + kSeenPrefix + std::to_string(rank()), 1);
  } catch (const std::exception&) {
  }
  abort();
}

void C10dTransport::watch() {
  const std::string alive = keys_ + kAlivePrefix + std::to_string(rank());
  const std::string waiting = keys_ + kWaitingPrefix + std::to_string(rank());
  int64_t published = -1;  // the rank waited for, as the store has it
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    stop_changed_.wait_for(lock, options_.poll_interval(), [this] { return stop_; });
    if (stop_ || failure_) continue;
    lock.unlock();
    try {
      store_->add(alive, 1);
      const int64_t now = waiting_for_;
      if (now != published) store_->add(waiting, now - published);
      published = now;
      if (auto found = lookup_failure()) adopt_failure(*found);
    } catch (const std::exception& e) {
      adopt_failure(store_failure(e.what()));
    }
    lock.lock();
  }
}

}  // namespace distributed
}  // namespace gpipe

// C10dTransport: the public class, which forwards to its Impl (c10d_transport_impl.h), and of
// the Impl what is neither the send nor the receive path: construction and closing, steps, the
// edges, their tags and the backends that carry them, and messages' names in errors.
#include "gpipe/distributed/c10d_transport.h"

#include "detail/stream.h"
#include "distributed/c10d_transport_impl.h"

#include <c10/util/Exception.h>

#include <exception>
#include <limits>
#include <sstream>
#include <utility>

namespace gpipe {
namespace distributed {
namespace {

// What a message of `kind` on `lane` carries, in errors.
std::string message_name(int64_t kind, schedule::Lane lane) {
  if (lane == schedule::Lane::kPipeline) return kind_name(kind);
  return kind == kActivation ? "skip tensors" : "skip gradients";
}

}  // namespace

C10dTransport::C10dTransport(ProcessGroup group, int64_t num_stages, C10dTransportOptions options)
    : impl_(std::make_unique<Impl>(std::move(group), num_stages, options)) {}

C10dTransport::~C10dTransport() = default;

void C10dTransport::send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag,
                         schedule::Lane lane) {
  impl_->send(std::move(batch), from_stage, to_stage, tag, lane);
}

Batch C10dTransport::recv(int64_t from_stage, int64_t to_stage, int64_t tag, schedule::Lane lane) {
  return impl_->recv(from_stage, to_stage, tag, lane);
}

void C10dTransport::abort() { impl_->abort(); }

void C10dTransport::flush() { impl_->flush(); }

void C10dTransport::begin_step() { impl_->begin_step(); }

void C10dTransport::expect_in_next_step(int64_t from_stage, int64_t to_stage, schedule::Lane lane) {
  impl_->expect_in_next_step(from_stage, to_stage, lane);
}

void C10dTransport::expect(int64_t from_stage, int64_t to_stage, int64_t count,
                           schedule::Lane lane) {
  impl_->expect(from_stage, to_stage, count, lane);
}

void C10dTransport::send_to_rank(at::Tensor value, int64_t to_rank) {
  impl_->send_to_rank(std::move(value), to_rank);
}

at::Tensor C10dTransport::recv_from_rank(int64_t from_rank, at::Tensor buffer) {
  return impl_->recv_from_rank(from_rank, std::move(buffer));
}

void C10dTransport::post_recv_from_rank(int64_t from_rank, at::Tensor buffer) {
  impl_->post_recv_from_rank(from_rank, std::move(buffer));
}

void C10dTransport::barrier(const std::string& name, std::chrono::milliseconds timeout) {
  impl_->monitor().barrier(name, timeout);
}

void C10dTransport::report_failure(const std::string& message) { impl_->monitor().report(message); }

std::optional<std::string> C10dTransport::failure() const { return impl_->monitor().failure(); }

double C10dTransport::communication_seconds() const { return impl_->communication_seconds(); }

double C10dTransport::transfer_seconds() const { return impl_->transfer_seconds(); }

void C10dTransport::reset_communication_seconds() { impl_->reset_communication_seconds(); }

int64_t C10dTransport::messages_sent() const { return impl_->messages_sent(); }

c10::Device C10dTransport::device() const { return impl_->device(); }

int64_t C10dTransport::rank() const { return impl_->rank(); }

int64_t C10dTransport::world_size() const { return impl_->world_size(); }

int64_t C10dTransport::pipeline_size() const { return impl_->pipeline_size(); }

int64_t C10dTransport::rank_of(int64_t stage) const { return impl_->rank_of(stage); }

std::string MessageName::str() const {
  std::ostringstream out;
  if (tag < 0) {
    out << "the next message from stage " << from << " to stage " << to;
    return out.str();
  }
  out << "the " << message_name(kind, lane) << " of micro-batch " << tag << " from stage " << from;
  if (!sending) out << " (rank " << peer << ")";
  out << " to stage " << to;
  if (sending) out << " (rank " << peer << ")";
  return out.str();
}

C10dTransport::Impl::Impl(ProcessGroup group, int64_t num_stages, C10dTransportOptions options)
    : group_(std::move(group)),
      num_stages_(num_stages),
      options_(options),
      pipeline_size_(options.pipeline_size() > 0 ? options.pipeline_size() : group_.world_size()),
      device_(detail::normalize_device(options.device())),
      // Every rank makes its transports over a group in the same order, so the count names the
      // same transport on every rank and keeps its keys and tags apart from the others'.
      index_(group_.transports ? (*group_.transports)++ : 0),
      keys_("gpipe/transport" + std::to_string(index_) + "/") {
  TORCH_CHECK_VALUE(num_stages > 0, "num_stages must be positive, but got ", num_stages);
  TORCH_CHECK_VALUE(num_stages <= kMostStages, "a transport carries at most ", kMostStages,
                    " stages, but got ", num_stages);
  TORCH_CHECK_VALUE(
      index_ < kMostTransports, "at most ", kMostTransports,
      " transports fit in one process group (each has its own tags), but this is number ",
      index_ + 1, ": rendezvous again for more");
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
  // The Impl stays where it is for its lifetime, and the watcher stops before the members
  // abort() uses are destroyed (monitor_ is the last).
  monitor_ = std::make_unique<FailureMonitor>(group_, keys_, options_.timeout(),
                                              options_.poll_interval(), [this] { abort(); });
}

C10dTransport::Impl::~Impl() {
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

void C10dTransport::Impl::begin_step() {
  const int64_t window = options_.receive_window() > 0 ? options_.receive_window()
                                                       : std::numeric_limits<int64_t>::max();
  for (const auto& [key, e] : edges_) {
    const auto& [from, to, lane] = key;
    const size_t left = e.posted.size() - std::min<size_t>(e.posted.size(), e.next_step);
    TORCH_CHECK_VALUE(left == 0, "rank ", rank(), " announced more messages from stage ", from,
                      " to stage ", to, " in the last step than came: ", left,
                      " receive(s) still posted");
  }
  for (auto& [key, e] : edges_) e.begin_step(window);
}

TransportEdge& C10dTransport::Impl::edge(int64_t from_stage, int64_t to_stage,
                                         schedule::Lane lane) {
  const bool neighbours = to_stage == from_stage + 1 || to_stage + 1 == from_stage;
  TORCH_CHECK_INDEX(
      from_stage >= 0 && from_stage < num_stages_ && to_stage >= 0 && to_stage < num_stages_ &&
          from_stage != to_stage && (neighbours || lane == schedule::Lane::kSkip),
      "no edge from stage ", from_stage, " to stage ", to_stage, " among ", num_stages_, " stages");
  return edges_[{from_stage, to_stage, lane}];
}

// Each transport's tags lie in a range of their own, kTagsPerTransport from the transport's index
// times it: transports over one group post receives ahead for their next steps, and a receive
// takes the first message on its tag, whichever transport sent it.
int C10dTransport::Impl::edge_tag(int64_t from_stage, int64_t to_stage, schedule::Lane lane) const {
  // s -> s + 1 is 2s, s + 1 -> s is 2s + 1; 2 * num_stages carries values between ranks; the
  // skip lane's edges come after it.
  const int64_t tag = lane == schedule::Lane::kSkip
                          ? 2 * num_stages_ + 1 + from_stage * num_stages_ + to_stage
                          : (to_stage > from_stage ? 2 * from_stage : 2 * to_stage + 1);
  return static_cast<int>(index_ * kTagsPerTransport + tag);
}

int C10dTransport::Impl::payload_tag(int edge_tag) const {
  // After every edge's tag (edge_tag) and the values' tag.
  return edge_tag + static_cast<int>(2 * num_stages_ + 1 + num_stages_ * num_stages_);
}

int C10dTransport::Impl::value_tag() const {
  // After the pipeline lane's edges' tags (edge_tag).
  return static_cast<int>(index_ * kTagsPerTransport + 2 * num_stages_);
}

Backend& C10dTransport::Impl::backend(const c10::Device& device, int tag) {
  if (device.is_cpu()) return *group_.group;
  auto& nccl = nccl_[tag];
  if (!nccl) {
    // NCCL's watchdog ends the process on its timeout: give the transport's own first say.
    nccl = new_nccl_backend(group_, keys_ + "tag" + std::to_string(tag), 2 * options_.timeout());
  }
  return *nccl;
}

}  // namespace distributed
}  // namespace gpipe

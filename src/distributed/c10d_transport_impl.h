// C10dTransport::Impl: the state behind a C10dTransport (gpipe/distributed/c10d_transport.h) and
// the steps of its sends and receives, which the public class forwards to. Defined by concept:
// construction, closing, steps, tags and backends in c10d_transport.cpp; the send path in
// c10d_transport_send.cpp; the receive path (receives posted ahead, and taken) in
// c10d_transport_recv.cpp; the waits that a failure aborts in c10d_transport_wait.cpp. What it
// keeps per edge: c10d_transport_edge.h.
//
// Thread safety: as C10dTransport's. The rank's worker calls all but abort(), which any thread
// may call, as the failure monitor's watcher does: what the two share is guarded by mutex_.
//
// Internal to the c10d transport.
#pragma once

#include "distributed/c10d_transport_edge.h"
#include "distributed/failure_monitor.h"
#include "distributed/wire_format.h"
#include "gpipe/distributed/c10d_transport.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace gpipe {
namespace distributed {

/// A message of an edge, in errors, with the rank at its other end: "the activation of
/// micro-batch 3 from stage 0 (rank 0) to stage 1" where it is received, "... from stage 0 to
/// stage 1 (rank 1)" where it is sent; "the next message from stage 0 to stage 1" for a receive
/// posted ahead (tag -1).
struct MessageName {
  int64_t kind;
  schedule::Lane lane;
  int64_t tag, from, to, peer;
  bool sending;

  std::string str() const;
};

class C10dTransport::Impl {
 public:
  /// As C10dTransport's constructor: checks the options, starts the watcher.
  Impl(ProcessGroup group, int64_t num_stages, C10dTransportOptions options);
  /// As C10dTransport's destructor.
  ~Impl();

  // C10dTransport's methods, which document them.
  void send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag, schedule::Lane lane);
  Batch recv(int64_t from_stage, int64_t to_stage, int64_t tag, schedule::Lane lane);
  void abort();
  void flush();
  void begin_step();
  void expect(int64_t from_stage, int64_t to_stage, int64_t count, schedule::Lane lane);
  void expect_in_next_step(int64_t from_stage, int64_t to_stage, schedule::Lane lane);
  void send_to_rank(at::Tensor value, int64_t to_rank);
  at::Tensor recv_from_rank(int64_t from_rank, at::Tensor buffer);
  void post_recv_from_rank(int64_t from_rank, at::Tensor buffer);

  /// Barriers, failures reported and the first failure recorded go straight to the monitor.
  FailureMonitor& monitor() const { return *monitor_; }

  double communication_seconds() const { return communication_seconds_; }
  double transfer_seconds() const { return transfer_seconds_; }
  void reset_communication_seconds() { communication_seconds_ = transfer_seconds_ = 0; }
  int64_t messages_sent() const { return messages_sent_; }
  c10::Device device() const { return device_; }
  int64_t rank() const { return group_.rank(); }
  int64_t world_size() const { return group_.world_size(); }
  int64_t pipeline_size() const { return pipeline_size_; }
  int64_t rank_of(int64_t stage) const {
    return rank() / pipeline_size_ * pipeline_size_ +
           schedule::worker_of(options_.placement(), stage, pipeline_size_);
  }

 private:
  // What a send or receive moves, in words: made only for an error.
  using What = std::function<std::string()>;
  using EdgeKey = std::tuple<int64_t, int64_t, schedule::Lane>;  // (from, to, lane)
  // An outstanding send: flush() waits for it, or release_sends() once it is known received.
  struct Send {
    c10::intrusive_ptr<c10d::Work> work;
    int64_t peer;
    What what;
    // For a batch's messages, its edge and its index among the edge's batches.
    std::optional<EdgeKey> edge;
    int64_t index = -1;
  };

  TransportEdge& edge(int64_t from_stage, int64_t to_stage, schedule::Lane lane);
  // The backend that carries tensors of `device` with tag `tag`: Gloo for CPU, else the tag's
  // NCCL backend (made on first use).
  Backend& backend(const c10::Device& device, int tag);
  // The tag of the edge's batches (their headers, and one-message batches whole).
  int edge_tag(int64_t from_stage, int64_t to_stage, schedule::Lane lane) const;
  // The tag of the tensors of the edge's batches that travel apart from their header.
  int payload_tag(int edge_tag) const;
  // The tag of values between ranks (send_to_rank).
  int value_tag() const;

  // Starts the receive of the edge's next message, into a buffer as large as its largest so far
  // and a header at least. Throws where the backend refuses (post() explains why).
  PostedReceive start_receive(const TransportEdge& e, int64_t from_stage, int64_t to_stage,
                              schedule::Lane lane);
  // Posts the receive of the edge's next unposted message (see C10dTransport's file comment).
  void post_receive(TransportEdge& e, int64_t from_stage, int64_t to_stage, schedule::Lane lane);
  // Posts receives while the edge has announced ones left and fewer than its window posted.
  void post_receives(TransportEdge& e, int64_t from_stage, int64_t to_stage, schedule::Lane lane);
  // Receives the tensors of a batch that travel apart from its header (`meta`), each in its own
  // message on the edge's payload tag.
  std::vector<at::Tensor> receive_payload(const MessageMetadata& meta, int64_t from_stage,
                                          int64_t to_stage, schedule::Lane lane, const What& what);

  // Waits for `work`, abortable by the watcher. On failure records and throws; `what` and
  // `peer` describe what was awaited.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const What& what, int64_t peer);
  // Drops the sends of the edge's first `taken` batches, waiting for each (at once: the peer
  // said it has them). A send holds its message - a one-message batch is a packed copy - until
  // then: Gloo tells a send's completion only to a wait, and a rank would otherwise hold every
  // message of a step until flush().
  void release_sends(const EdgeKey& edge, int64_t taken);
  // Posts a send or receive; if Gloo refuses (a closed connection), the peer failed.
  c10::intrusive_ptr<c10d::Work> post(const std::function<c10::intrusive_ptr<c10d::Work>()>& start,
                                      const What& what, int64_t peer);
  // Records the failure that explains a failed wait for `peer` and throws.
  [[noreturn]] void peer_failed(const std::string& what, int64_t peer, const std::string& error,
                                bool timed_out);
  [[noreturn]] void throw_failure(const std::string& what);
  // True once abort() ran (also on any failure): waits must end.
  bool aborted() const;

  ProcessGroup group_;
  // Tags: each transport's range (edge_tag) holds its edges' tags, the values' and the payloads'
  // (2 * (2S + 1 + S^2) for S stages); 1024 ranges fit in a Gloo tag (an int).
  static constexpr int64_t kTagsPerTransport = int64_t{1} << 21;
  static constexpr int64_t kMostStages = 1022;
  static constexpr int64_t kMostTransports = 1024;

  int64_t num_stages_;
  C10dTransportOptions options_;
  int64_t pipeline_size_;
  c10::Device device_;
  int64_t index_;     // of the transports made over the group, counted alike on every rank
  std::string keys_;  // the prefix of this transport's keys in the store
  std::map<EdgeKey, TransportEdge> edges_;
  // Activations sent per (from_stage, to_stage, lane, micro-batch): what their gradients must
  // look like.
  std::map<std::tuple<int64_t, int64_t, schedule::Lane, int64_t>, MessageMetadata> sent_;
  std::map<int64_t, PostedReceive> posted_values_;   // post_recv_from_rank, per rank
  std::vector<Send> sends_;                          // outstanding sends
  std::map<int, c10::intrusive_ptr<Backend>> nccl_;  // per tag, for CUDA tensors
  double communication_seconds_ = 0;
  double transfer_seconds_ = 0;
  int64_t messages_sent_ = 0;

  mutable std::mutex mutex_;
  bool aborted_ = false;                                 // guarded by mutex_
  std::vector<c10::intrusive_ptr<c10d::Work>> waiting_;  // guarded by mutex_
  // Last: its watcher calls abort(), which needs the members above.
  std::unique_ptr<FailureMonitor> monitor_;
};

}  // namespace distributed
}  // namespace gpipe

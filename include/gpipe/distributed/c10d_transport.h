// C10dTransport: the Transport (schedule/transport.h) between processes, over c10d: Gloo for
// CPU tensors, NCCL for CUDA tensors.
//
// Stage s runs on rank s % world_size, or as the V placement says (schedule/action.h), of the
// world or of this rank's block of P ranks, with several pipelines side by side: pipeline_size. A
// batch starts with a fixed-size header (int64: kind, micro-batch, stages, and per tensor its dtype
// and shape), on the directed edge's own tag, so edges between the same two ranks (interleaved
// schedules) never mix, nor do the two lanes of an edge (schedule/transport.h): the skip lane's
// edges, between any two stages, are tagged after the pipeline's. A batch that fits the buffer
// the receiver posted for it travels as one message, header and tensors' bytes together (received
// tensors are views of that buffer); a larger one, such as the edge's first, as the header and
// then one message per non-empty tensor on the edge's payload tag. Sends are asynchronous: their
// work, and with it the message (a one-message batch is a packed copy), is kept until it is known
// received (Gloo tells a send's completion only to a wait): each header says how many batches
// its sender has received on the edge back, so a gradient that comes lets go of the activations
// it counts, an activation of the gradients; flush() waits for the rest.
//
// Messages in flight (expect()): Gloo writes a send only once the receiver has posted its
// receive, so a receive posted on demand costs a round trip before the batch moves, and the
// sending rank's Gloo thread must win a core from its compute thread. So the receiver posts the
// step's receives ahead, up to a window per edge and lane (receive_window): the sender writes
// each batch at once from its own thread. Several receives posted on one tag take the messages in
// the order they were sent (Gloo matches them first in, first out per peer and tag; NCCL keeps a
// backend per tag), which is why a split batch's tensors go on a tag of their own: they must not
// land in a receive posted for the edge's next batch. A buffer is posted with the largest message
// that had arrived on the edge by then, and the sender knows which that was (posted_capacity,
// src/distributed/c10d_transport_edge.h), so both ends agree whether a batch fits. On an edge's
// first step the window is 1, so that its capacity is learnt before receives are posted deep.
//
// Metadata: the first message on each edge (in each step: begin_step()) fixes the edge's metadata
// (number of tensors, dtypes, shapes but the batch dimension); each later one must agree, and a
// gradient must have the dtype and shape of the activation it belongs to. Both ends check, so a
// mismatch is a c10::ValueError naming the stages, the micro-batch, what was agreed and what came,
// not garbage or a hang. (The wire format: src/distributed/wire_format.h.)
//
// Failures: report_failure() writes "rank R failed: <message>" into the store. A watcher thread
// polls the store; once any rank has failed, every wait of this rank is aborted and throws
// c10::Error with that message. A peer that dies (its connections close) is recorded as failed
// by the rank that waited for it. A wait that times out names the rank that stopped answering,
// which need not be the peer waited for: every watcher beats in the store and says whom its
// rank waits for, so the waits are followed to the rank that is stopped (no beat) or waits for
// nobody (hangs in its own code), about a second after the timeout. Losing the store, or the
// store not answering within the timeout, means that rank 0, which serves it, is gone or
// stopped. After a failure the transport is unusable: end the process. (The protocol:
// src/distributed/failure_monitor.h.)
//
// Devices: a transport moves the tensors of one device, its option `device`: the stages' device
// on this rank. CPU tensors go over the group's Gloo backend; CUDA tensors over NCCL, one
// backend per edge (NCCL has no tags: each edge's messages must keep their own order), made on
// the edge's first message. Messages are laid out alike on both; a NCCL message's header is
// copied to the host to be read, and its waits poll the work, so that aborts and the timeout
// behave as with Gloo. The loss travels over Gloo as a CPU tensor.
//
// Several transports (at most 1024) may share one ProcessGroup, one after another or in turns:
// each has its own keys in the store and its own tags, so that a receive one posted ahead never
// takes another's message, as long as every rank makes them in the same order.
//
// Thread safety: send(), recv(), flush() and report_failure() are called by one thread (the
// rank's worker); abort() from any thread, as the failure monitor's watcher does. (The state
// behind the class, and what guards it: src/distributed/c10d_transport_impl.h.)
#pragma once

#include "gpipe/distributed/rendezvous.h"
#include "gpipe/schedule/action.h"
#include "gpipe/schedule/transport.h"

#include <c10/core/Device.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace gpipe {
namespace distributed {

/// Options for C10dTransport.
struct C10dTransportOptions {
  /// The longest a send or receive waits for its peer before that peer counts as failed.
  /// Default: 300 s.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(300);

  /// How often the watcher looks in the store for failures of other ranks. Default: 50 ms.
  TORCH_ARG(std::chrono::milliseconds, poll_interval) = std::chrono::milliseconds(50);

  /// The ranks of one pipeline: ranks come in consecutive blocks of this many, one pipeline
  /// (replica) each (data_parallel.h); 0 for the whole world. Default: 0.
  TORCH_ARG(int64_t, pipeline_size) = 0;

  /// Which rank of the pipeline runs which stage: stage s on its rank s % pipeline_size, or in a
  /// V. Default: schedule::Placement::kLooped.
  TORCH_ARG(schedule::Placement, placement) = schedule::Placement::kLooped;

  /// The device of this rank's stages: every tensor sent is on it and every batch received lands
  /// on it. CPU goes over Gloo, CUDA over NCCL. Default: CPU.
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);

  /// The most receives posted ahead on one edge and lane (expect()); 0 for every one a step
  /// announces. Each holds a buffer as large as the edge's largest batch. Every rank of a
  /// pipeline must use the same window. Default: 0.
  TORCH_ARG(int64_t, receive_window) = 0;
};

/// Moves Batches between stages on different ranks.
class C10dTransport : public schedule::Transport {
 public:
  /// For `num_stages` stages over `group`. Starts the watcher. Throws c10::ValueError unless
  /// num_stages is positive, or for a device other than CPU or CUDA; c10::Error for a CUDA device
  /// where this gpipe has no NCCL.
  C10dTransport(ProcessGroup group, int64_t num_stages, C10dTransportOptions options = {});

  /// Stops the watcher; without a failure, waits for outstanding sends and then for every rank
  /// to close, so that rank 0 keeps serving the store until nobody needs it.
  ~C10dTransport() override;

  C10dTransport(const C10dTransport&) = delete;
  C10dTransport& operator=(const C10dTransport&) = delete;

  /// REQUIRES: this rank runs from_stage; to_stage is a neighbour on the pipeline lane. Throws
  /// c10::ValueError on a metadata mismatch, c10::Error after any rank failed.
  void send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag,
            schedule::Lane lane = schedule::Lane::kPipeline) override;

  /// REQUIRES: this rank runs to_stage. Throws c10::ValueError on a metadata mismatch or an
  /// unexpected message, c10::Error if the peer fails, dies or times out, or any rank failed.
  Batch recv(int64_t from_stage, int64_t to_stage, int64_t tag,
             schedule::Lane lane = schedule::Lane::kPipeline) override;

  /// Aborts the waits of this rank (they throw); does not tell other ranks (report_failure does).
  void abort() override;

  /// Waits until every send so far has been received.
  void flush();

  /// Starts a step: forgets the metadata agreed in the last one, so shapes may change from step
  /// to step (e.g. sequence lengths), not within one. Both ends of an edge call it between the
  /// same messages. Throws c10::ValueError if a receive posted ahead in the last step is still
  /// waiting for its message (more were announced than came), but for those announced for this
  /// step (expect_in_next_step).
  void begin_step();

  /// Announces that the edge's next `count` messages on `lane` from `from_stage` to this rank's
  /// `to_stage` come in this step: their receives are posted ahead, up to receive_window at a
  /// time (1 on the edge's first step), each next one as soon as a message has arrived, so a
  /// sender never waits for this rank to ask. Announce only batches that will come: a receive
  /// posted for one that does not would take the edge's next message. Throws c10::ValueError for
  /// a negative count, a stage this rank does not run, or a stage with no such edge.
  void expect(int64_t from_stage, int64_t to_stage, int64_t count,
              schedule::Lane lane = schedule::Lane::kPipeline);

  /// Announces, before this step ends, that the edge's first message of the next step comes, and
  /// posts its receive now: a sender that begins the next step before this rank does (this rank
  /// still waits, say, for a tied weight's gradient) then need not wait for it to ask. Only for
  /// an edge that carries a message in every step, as activations do; begin_step() counts it as
  /// expected, and expect() then counts it among the step's. Over Gloo only (CPU tensors); with
  /// NCCL, and where the peer has closed its connection (it finished), it posts nothing. Throws
  /// c10::ValueError for a stage this rank does not run or a stage with no such edge.
  void expect_in_next_step(int64_t from_stage, int64_t to_stage,
                           schedule::Lane lane = schedule::Lane::kPipeline);

  /// Sends `value` from this rank to `to_rank` outside the stages' edges (e.g. the loss), and
  /// receives one into `buffer` (or into the buffer of the receive posted ahead with
  /// post_recv_from_rank, which is returned). Same failure behaviour as send() and recv().
  void send_to_rank(at::Tensor value, int64_t to_rank);
  at::Tensor recv_from_rank(int64_t from_rank, at::Tensor buffer);
  /// Posts the receive of recv_from_rank(from_rank, ...) now, so the sender need not wait for it.
  /// Throws c10::ValueError if one from that rank is already posted.
  void post_recv_from_rank(int64_t from_rank, at::Tensor buffer);

  /// Waits until every rank has called barrier(name) (through the store), at most `timeout`.
  /// Throws c10::Error naming rank 0 if the store is lost, or saying how many ranks came.
  void barrier(const std::string& name, std::chrono::milliseconds timeout);

  /// Records in the store that this rank failed with `message`, unless another rank's failure
  /// was recorded first (then this failure is its consequence), and waits a little for the other
  /// ranks to see it.
  void report_failure(const std::string& message);

  /// The first failure recorded in the store, if any rank failed.
  std::optional<std::string> failure() const;

  /// Seconds spent waiting in send, recv and flush since the last reset.
  double communication_seconds() const;
  /// Of those, the seconds spent on the data's own movement, without the waits for the peer to
  /// compute it: copying batches into one-message buffers, receiving tensors whose header had
  /// arrived, and flush().
  double transfer_seconds() const;
  void reset_communication_seconds();

  /// The Gloo messages send() has posted: one per batch, or a header and one per non-empty
  /// tensor for a batch larger than every earlier one on its edge.
  int64_t messages_sent() const;

  /// The device of this rank's stages (options().device(), with its index).
  c10::Device device() const;

  int64_t rank() const;
  int64_t world_size() const;
  int64_t pipeline_size() const;
  /// The rank that runs `stage` in this rank's pipeline.
  int64_t rank_of(int64_t stage) const;

 private:
  class Impl;  // src/distributed/c10d_transport_impl.h
  std::unique_ptr<Impl> impl_;
};

}  // namespace distributed
}  // namespace gpipe

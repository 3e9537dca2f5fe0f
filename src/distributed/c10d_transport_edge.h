// TransportEdge: what the c10d transport (gpipe/distributed/c10d_transport.h) keeps of one
// directed edge and lane: the metadata its step's first message fixed, the sizes of the buffers
// the receiver posts for its messages, which sender and receiver keep alike so that both know
// whether a batch fits its buffer, and at the receiver the receives posted ahead (the window).
//
// Thread safety: none; the rank's worker alone uses it.
//
// Internal to the c10d transport.
#pragma once

#include "distributed/wire_format.h"
#include "gpipe/distributed/rendezvous.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace gpipe {
namespace distributed {

/// The largest batch that travels as one message, copied into it. A split batch's tensors travel
/// uncopied, but only once the receiver asks for them: on the step's critical path. Below this,
/// the copy (memory the allocator reuses, gpipe/cpu_malloc.h) costs less than that wait; above
/// it, every buffer is a fresh mapping whose pages fault in as the copy writes them.
constexpr int64_t kMaxOneMessageBytes = 32 << 20;

/// A receive posted ahead, and the buffer it receives into.
struct PostedReceive {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor buffer;
};

/// One directed edge and lane of the transport.
struct TransportEdge {
  std::optional<MessageMetadata> agreed;  ///< fixed by the step's first message
  /// Bytes of the one-message batches on the edge (kMaxOneMessageBytes at most), kept alike at
  /// both ends: the largest so far, the largest before this step, and per message of this step
  /// the largest up to it.
  int64_t capacity = 0;
  int64_t step_capacity = 0;
  std::vector<int64_t> step_max;
  int64_t messages = 0;  ///< on the edge so far
  int64_t window = 1;    ///< receives posted ahead at most, this step
  int64_t unposted = 0;  ///< announced receives not posted yet (expect())
  /// Receives posted for the next step's first messages (C10dTransport::expect_in_next_step).
  size_t next_step = 0;
  std::deque<PostedReceive> posted;  ///< in the order of the messages they take

  /// The size of the buffer the receiver posted for the step's message `j`: it posted it once
  /// message j - window had arrived (the first `window` when the step began), as large as the
  /// largest message by then, and at least a header. A receive posted later, on demand, is no
  /// smaller.
  int64_t posted_capacity(int64_t j) const;
  /// Records the step's next message, of `bytes`.
  void record(int64_t bytes);
  /// Starts a step with at most `receive_window` receives posted ahead: forgets the agreed
  /// metadata and the last step's messages. On the edge's first step the window is 1, so that its
  /// buffers' size is learnt message by message.
  void begin_step(int64_t receive_window);
};

}  // namespace distributed
}  // namespace gpipe

// Transport: moves activations and gradients between the stages of a pipeline schedule.
//
// A schedule's kSend* action calls send() on the sending stage's side and the matching kRecv*
// action calls recv() on the receiving side. Messages go along directed edges between stages
// (from_stage -> to_stage); each edge is first in, first out, and `tag` (the micro-batch) checks
// that a receive takes the message it expects. A message is a Batch; a gradient message holds an
// undefined tensor where the input tensor has no gradient.
//
// Two lanes: the schedule's activations and gradients go between neighbouring stages
// (Lane::kPipeline); skip connections (skip/skippable.h) go on Lane::kSkip straight from the
// stage that stashes them to the one that pops them, however far, and their gradients back, so
// the stages between never see them. Each lane of an edge keeps its own order. The skip lane is
// never full: what it holds, the stashing stage keeps for its backward anyway.
//
// Implementations: ThreadTransport (thread_transport.h) for stages on threads of one process. A
// transport across processes (e.g. c10d send/recv) implements the same calls for the stages of
// its own process.
//
// Thread safety: send() and recv() are called concurrently by the workers, each for the stages it
// runs; abort() may be called from any thread at any time.
#pragma once

#include "gpipe/microbatch.h"

#include <cstdint>

namespace gpipe {
namespace schedule {

/// Which messages an edge carries; see the file comment.
enum class Lane { kPipeline, kSkip };

/// Moves Batches between stages.
class Transport {
 public:
  virtual ~Transport();

  /// Sends `batch` from `from_stage` to `to_stage` as message `tag` on `lane`. May return before
  /// the receiver has it; may wait while the edge's pipeline lane is full. Throws c10::Error once
  /// aborted.
  virtual void send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag,
                    Lane lane = Lane::kPipeline) = 0;

  /// Receives the next message on `lane` of the edge from `from_stage` to `to_stage`, waiting
  /// until it arrives. Throws c10::ValueError if that message's tag is not `tag`, and c10::Error
  /// once aborted.
  virtual Batch recv(int64_t from_stage, int64_t to_stage, int64_t tag,
                     Lane lane = Lane::kPipeline) = 0;

  /// Wakes every send() and recv() waiting now or later, which then throw: a stage has failed.
  virtual void abort() = 0;
};

}  // namespace schedule
}  // namespace gpipe

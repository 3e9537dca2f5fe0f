// The receive path of the c10d transport (C10dTransport::Impl, c10d_transport_impl.h): receives
// posted ahead on an edge, up to its window (expect()); a batch taken from the next of them
// (recv()); and values between ranks.
#include "distributed/c10d_transport_impl.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <utility>

namespace gpipe {
namespace distributed {

void C10dTransport::Impl::expect(int64_t from_stage, int64_t to_stage, int64_t count,
                                 schedule::Lane lane) {
  TORCH_CHECK_VALUE(count >= 0, "count must be non-negative, but got ", count);
  TORCH_CHECK_VALUE(rank_of(to_stage) == rank(), "rank ", rank(), " cannot receive for stage ",
                    to_stage, ", which rank ", rank_of(to_stage), " runs");
  TransportEdge& e = edge(from_stage, to_stage, lane);
  // Receives already posted take the first of them.
  e.unposted = std::max<int64_t>(0, count - static_cast<int64_t>(e.posted.size()));
  post_receives(e, from_stage, to_stage, lane);
}

void C10dTransport::Impl::expect_in_next_step(int64_t from_stage, int64_t to_stage,
                                              schedule::Lane lane) {
  TORCH_CHECK_VALUE(rank_of(to_stage) == rank(), "rank ", rank(), " cannot receive for stage ",
                    to_stage, ", which rank ", rank_of(to_stage), " runs");
  TransportEdge& e = edge(from_stage, to_stage, lane);
  TORCH_CHECK_VALUE(e.posted.empty() && e.unposted == 0, "rank ", rank(),
                    " announced a message from stage ", from_stage, " to stage ", to_stage,
                    " in the next step while this step's are still expected");
  // Only over Gloo: a receive posted to NCCL for a step that never comes would keep its
  // communicator from closing.
  if (!device_.is_cpu()) return;
  // Posted as large as the next step's first receive would be: the capacity so far, which the
  // sender knows too (TransportEdge::posted_capacity). Speculatively: after the last step the peer
  // may already have closed its connection, and then nothing is posted; a next step would fail
  // on the edge as it would have anyway.
  try {
    e.posted.push_back(start_receive(e, from_stage, to_stage, lane));
  } catch (const std::exception&) {
    return;
  }
  e.next_step = 1;
}

PostedReceive C10dTransport::Impl::start_receive(const TransportEdge& e, int64_t from_stage,
                                                 int64_t to_stage, schedule::Lane lane) {
  std::vector<at::Tensor> buffer{at::empty({std::max(e.capacity, kHeaderBytes)},
                                           at::TensorOptions(at::kByte).device(device_))};
  const int tag = edge_tag(from_stage, to_stage, lane);
  auto work = backend(device_, tag).recv(buffer, static_cast<int>(rank_of(from_stage)), tag);
  return PostedReceive{std::move(work), buffer[0]};
}

void C10dTransport::Impl::post_receive(TransportEdge& e, int64_t from_stage, int64_t to_stage,
                                       schedule::Lane lane) {
  const int64_t peer = rank_of(from_stage);
  const MessageName name{to_stage > from_stage ? kActivation : kGradient,
                         lane,
                         /*tag=*/-1,
                         from_stage,
                         to_stage,
                         peer,
                         /*sending=*/false};
  PostedReceive posted;
  post(
      [&] {
        posted = start_receive(e, from_stage, to_stage, lane);
        return posted.work;
      },
      [name] { return name.str(); }, peer);
  e.posted.push_back(std::move(posted));
  --e.unposted;
}

void C10dTransport::Impl::post_receives(TransportEdge& e, int64_t from_stage, int64_t to_stage,
                                        schedule::Lane lane) {
  while (e.unposted > 0 && static_cast<int64_t>(e.posted.size()) < e.window) {
    post_receive(e, from_stage, to_stage, lane);
  }
}

Batch C10dTransport::Impl::recv(int64_t from_stage, int64_t to_stage, int64_t tag,
                                schedule::Lane lane) {
  TransportEdge& e = edge(from_stage, to_stage, lane);
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
  // Awaited; its header read and checked against what was expected and agreed; the edge's next
  // receive posted; its tensors handed out.
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
    sent_[{from_stage, to_stage, lane, tag}] = h.meta;
  } else {
    auto it = sent_.find({to_stage, from_stage, lane, tag});
    TORCH_INTERNAL_ASSERT(it != sent_.end(), "stage ", to_stage, " sent no activation of ",
                          "micro-batch ", tag);
    TORCH_CHECK_VALUE(fits(h.meta, it->second), "stage ", to_stage, " received from stage ",
                      from_stage, " for micro-batch ", tag, " a gradient ", describe(h.meta),
                      ", but the activation was ", describe(it->second));
    sent_.erase(it);
  }
  release_sends({to_stage, from_stage, lane}, h.taken);
  const MessageLayout layout = layout_of(h.meta);
  e.record(layout.bytes);
  // The next receive goes out before this batch's own tensors are taken: it holds the next batch.
  post_receives(e, from_stage, to_stage, lane);
  std::vector<at::Tensor> tensors = h.one_message
                                        ? unpack(posted.buffer, h.meta, layout)
                                        : receive_payload(h.meta, from_stage, to_stage, lane, what);
  if (h.meta.atomic && tensors.size() == 1) return Batch(std::move(tensors[0]));
  return Batch(std::move(tensors));
}

std::vector<at::Tensor> C10dTransport::Impl::receive_payload(const MessageMetadata& meta,
                                                             int64_t from_stage, int64_t to_stage,
                                                             schedule::Lane lane,
                                                             const What& what) {
  const int64_t peer = rank_of(from_stage);
  const int t = payload_tag(edge_tag(from_stage, to_stage, lane));
  std::vector<at::Tensor> tensors;
  for (const auto k : c10::irange(meta.dtypes.size())) {
    if (meta.dtypes[k] == kUndefined) {
      tensors.emplace_back();
      continue;
    }
    at::Tensor x =
        at::empty(meta.shapes[k],
                  at::TensorOptions(static_cast<c10::ScalarType>(meta.dtypes[k])).device(device_));
    if (x.numel() > 0) {
      // The header came first: this wait is the data's own movement, not the peer's compute.
      std::vector<at::Tensor> payload{x};
      const double before = communication_seconds_;
      Backend& wire = backend(device_, t);
      wait(post([&] { return wire.recv(payload, static_cast<int>(peer), t); }, what, peer), what,
           peer);
      transfer_seconds_ += communication_seconds_ - before;
    }
    tensors.push_back(std::move(x));
  }
  return tensors;
}

void C10dTransport::Impl::post_recv_from_rank(int64_t from_rank, at::Tensor buffer) {
  const What what = [from_rank] { return "a value from rank " + std::to_string(from_rank); };
  if (aborted()) throw_failure("waiting for " + what());
  TORCH_CHECK_VALUE(posted_values_.count(from_rank) == 0, "a receive from rank ", from_rank,
                    " is already posted");
  std::vector<at::Tensor> tensors{buffer};
  const int tag = value_tag();
  Backend& wire = backend(buffer.device(), tag);
  auto work =
      post([&] { return wire.recv(tensors, static_cast<int>(from_rank), tag); }, what, from_rank);
  posted_values_.emplace(from_rank, PostedReceive{std::move(work), std::move(buffer)});
}

at::Tensor C10dTransport::Impl::recv_from_rank(int64_t from_rank, at::Tensor buffer) {
  const What what = [from_rank] { return "a value from rank " + std::to_string(from_rank); };
  if (aborted()) throw_failure("waiting for " + what());
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

}  // namespace distributed
}  // namespace gpipe

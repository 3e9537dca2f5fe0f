// The send path of the c10d transport (C10dTransport::Impl, c10d_transport_impl.h): a batch
// checked against the edge's metadata and posted, as one message where it fits the buffer the
// receiver posted for it, else as its header and then its tensors; values between ranks; and
// flush(), which waits for what was posted.
#include "distributed/c10d_transport_impl.h"

#include <c10/util/Exception.h>

#include <utility>

namespace gpipe {
namespace distributed {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void C10dTransport::Impl::send(Batch batch, int64_t from_stage, int64_t to_stage, int64_t tag,
                               schedule::Lane lane) {
  TransportEdge& e = edge(from_stage, to_stage, lane);
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
    sent_[{from_stage, to_stage, lane, tag}] = meta;
  } else {
    auto it = sent_.find({to_stage, from_stage, lane, tag});
    TORCH_INTERNAL_ASSERT(it != sent_.end(), "no activation of micro-batch ", tag,
                          " came to stage ", from_stage);
    TORCH_CHECK_VALUE(fits(meta, it->second), "stage ", from_stage, " sends to stage ", to_stage,
                      " for micro-batch ", tag, " a gradient ", describe(meta),
                      ", but the activation was ", describe(it->second));
    sent_.erase(it);
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
  const int64_t index = e.messages;
  const bool one_message =
      layout.bytes <= e.posted_capacity(static_cast<int64_t>(e.step_max.size()));
  e.record(layout.bytes);
  // The batches taken from the edge back tell the peer which of its sends it may let go.
  const auto back = edges_.find({to_stage, from_stage, lane});
  Header header{kind, tag, from_stage, to_stage, meta, one_message, /*taken=*/0};
  if (back != edges_.end()) header.taken = back->second.messages;
  const auto send = [&](at::Tensor message, int on_tag) {
    std::vector<at::Tensor> tensors{std::move(message)};
    ++messages_sent_;
    sends_.push_back({post([&] { return wire.send(tensors, peer, on_tag); }, what, peer), peer,
                      what, EdgeKey{from_stage, to_stage, lane}, index});
  };
  if (one_message) {
    const auto copying = Clock::now();
    at::Tensor message = pack(header, batch, layout, device_);
    transfer_seconds_ += std::chrono::duration<double>(Clock::now() - copying).count();
    send(std::move(message), t);
  } else {
    send(encode(header).view(at::kByte).to(device_), t);
    for (const auto& x : batch) {
      if (x.defined() && x.numel() > 0) send(x.contiguous(), payload_tag(t));
    }
  }
  communication_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
}

void C10dTransport::Impl::send_to_rank(at::Tensor value, int64_t to_rank) {
  const What what = [to_rank] { return "a value to rank " + std::to_string(to_rank); };
  if (aborted()) throw_failure("sending " + what());
  const auto start = Clock::now();
  std::vector<at::Tensor> tensors{value.contiguous()};
  const int tag = value_tag();
  Backend& wire = backend(value.device(), tag);
  sends_.push_back(
      {post([&] { return wire.send(tensors, static_cast<int>(to_rank), tag); }, what, to_rank),
       to_rank, what, std::nullopt});
  communication_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
}

void C10dTransport::Impl::release_sends(const EdgeKey& edge, int64_t taken) {
  size_t kept = 0;
  for (size_t k = 0; k < sends_.size(); ++k) {
    Send& send = sends_[k];
    if (send.edge == edge && send.index < taken) {
      wait(send.work, [&send] { return "the receipt of " + send.what(); }, send.peer);
      continue;
    }
    if (kept != k) sends_[kept] = std::move(send);
    ++kept;
  }
  sends_.resize(kept);
}

void C10dTransport::Impl::flush() {
  std::vector<Send> sends;
  sends.swap(sends_);
  const double before = communication_seconds_;
  for (const auto& send : sends) {
    wait(send.work, [&send] { return "the receipt of " + send.what(); }, send.peer);
  }
  transfer_seconds_ += communication_seconds_ - before;
}

}  // namespace distributed
}  // namespace gpipe

// The wire format of the c10d transport (c10d_transport.h): what a batch's header says, where
// its tensors sit in a one-message batch (packed by the sender, unpacked by the receiver), and
// the agreement checks on the metadata. Sender and receiver compute all of it alike from the
// metadata.
//
// A header is kHeaderSize int64 values: magic, kind, micro-batch, from stage, to stage, atomic,
// number of tensors, whether the tensors follow in the same message, the messages its sender had
// taken from the edge back (the receipts of the receiver's sends); then per tensor its dtype (-1:
// undefined), its number of dimensions and its shape.
//
// Internal to the c10d transport.
#pragma once

#include "gpipe/microbatch.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpipe {
namespace distributed {

constexpr int64_t kHeaderSize = 256;
constexpr int64_t kHeaderBytes = kHeaderSize * static_cast<int64_t>(sizeof(int64_t));
constexpr int64_t kAlignment = 64;      // of each tensor in a one-message batch
constexpr int64_t kMagic = 0x67706970;  // "gpip"
constexpr int64_t kUndefined = -1;      // the dtype of an undefined tensor

enum MessageKind : int64_t { kActivation = 0, kGradient = 1, kValue = 2 };

/// The dtype and shape of each tensor of a message (an undefined tensor has dtype -1).
struct MessageMetadata {
  bool atomic = true;
  std::vector<int64_t> dtypes;
  std::vector<std::vector<int64_t>> shapes;
};

// Where a batch's tensors sit in its one message: after the header, each defined tensor's data
// at a 64-byte-aligned offset (-1 for an undefined tensor); `bytes` in all. Sender and receiver
// compute it alike from the metadata.
struct MessageLayout {
  std::vector<int64_t> offsets;
  int64_t bytes = kHeaderBytes;
};

struct Header {
  int64_t kind, tag, from, to;
  MessageMetadata meta;
  bool one_message;  // the tensors' data follows the header in the same message
  // Batches its sender had received whole on the edge back (to -> from, same lane) when it sent
  // it: the receiver's sends on that edge up to there have been received.
  int64_t taken;
};

const char* kind_name(int64_t kind);
MessageMetadata metadata_of(const Batch& batch);
// E.g. "(Float[2, 8], Long[2])"; with `any_batch`, the first dimension prints as *.
std::string describe(const MessageMetadata& meta, bool any_batch = false);
// Same tensors, dtypes and shapes but (with any_batch) the first dimension.
bool agrees(const MessageMetadata& a, const MessageMetadata& b, bool any_batch);
// A gradient matches its activation: each tensor undefined or of the activation's dtype and shape.
bool fits(const MessageMetadata& grad, const MessageMetadata& activation);
MessageLayout layout_of(const MessageMetadata& meta);
// The bytes of `buffer` at `offset` as a tensor of `dtype` and `shape` (no copy: it keeps the
// buffer alive).
at::Tensor view_bytes(const at::Tensor& buffer, int64_t offset, int64_t dtype,
                      const std::vector<int64_t>& shape);
// Writes `header` into `out` (kHeaderSize values); throws c10::ValueError if its metadata does
// not fit in one.
void encode(const Header& header, int64_t* out);
// The same as a tensor of kHeaderSize int64 values on the CPU.
at::Tensor encode(const Header& header);
// `batch` (laid out as `layout`) as one message on `device`: `header` (one_message) and then its
// tensors' bytes. Throws c10::ValueError if the metadata does not fit in a header.
at::Tensor pack(const Header& header, const Batch& batch, const MessageLayout& layout,
                const c10::Device& device);
// The tensors of a batch that came in one message (`message`, of metadata `meta`, laid out as
// `layout`): views of its bytes, undefined where the metadata says so.
std::vector<at::Tensor> unpack(const at::Tensor& message, const MessageMetadata& meta,
                               const MessageLayout& layout);
// Reads a header (kHeaderSize values) received by `rank` from `peer`; throws c10::ValueError for
// one that is not.
Header decode(const int64_t* header, int64_t rank, int64_t peer);
// The same from the first kHeaderBytes of a received byte buffer, on any device.
Header decode(const at::Tensor& received, int64_t rank, int64_t peer);

}  // namespace distributed
}  // namespace gpipe

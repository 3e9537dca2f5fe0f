#include "distributed/wire_format.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cstring>
#include <sstream>

namespace gpipe {
namespace distributed {

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

MessageMetadata metadata_of(const Batch& batch) {
  MessageMetadata meta;
  meta.atomic = batch.atomic();
  for (const auto& t : batch) {
    meta.dtypes.push_back(t.defined() ? static_cast<int64_t>(t.scalar_type()) : kUndefined);
    meta.shapes.push_back(t.defined() ? t.sizes().vec() : std::vector<int64_t>{});
  }
  return meta;
}

std::string describe(const MessageMetadata& meta, bool any_batch) {
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

at::Tensor view_bytes(const at::Tensor& buffer, int64_t offset, int64_t dtype,
                      const std::vector<int64_t>& shape) {
  // One tensor over the buffer's bytes: cheaper than narrowing and viewing it (three ops).
  auto* data = static_cast<uint8_t*>(buffer.data_ptr()) + offset;
  return at::from_blob(
      data, shape, [keep = buffer](void*) {},
      at::TensorOptions(static_cast<c10::ScalarType>(dtype)).device(buffer.device()));
}

void encode(const Header& header, int64_t* out) {
  const MessageMetadata& meta = header.meta;
  int64_t entries = 9;
  for (const auto& shape : meta.shapes) entries += 2 + static_cast<int64_t>(shape.size());
  TORCH_CHECK_VALUE(entries <= kHeaderSize, "stage ", header.from, " cannot send the metadata of ",
                    meta.dtypes.size(), " tensors ", describe(meta), " to stage ", header.to,
                    ": it needs ", entries, " header entries, but a header holds ", kHeaderSize);
  int64_t* h = out;
  *h++ = kMagic;
  *h++ = header.kind;
  *h++ = header.tag;
  *h++ = header.from;
  *h++ = header.to;
  *h++ = meta.atomic ? 1 : 0;
  *h++ = static_cast<int64_t>(meta.dtypes.size());
  *h++ = header.one_message ? 1 : 0;
  *h++ = header.taken;
  for (const auto k : c10::irange(meta.dtypes.size())) {
    *h++ = meta.dtypes[k];
    *h++ = static_cast<int64_t>(meta.shapes[k].size());
    h = std::copy(meta.shapes[k].begin(), meta.shapes[k].end(), h);
  }
  std::fill(h, out + kHeaderSize, 0);
}

at::Tensor encode(const Header& header) {
  at::Tensor out = at::empty({kHeaderSize}, at::kLong);
  encode(header, out.data_ptr<int64_t>());
  return out;
}

at::Tensor pack(const Header& header, const Batch& batch, const MessageLayout& layout,
                const c10::Device& device) {
  at::NoGradGuard no_grad;  // bytes to send, not part of any graph
  const MessageMetadata& meta = header.meta;
  at::Tensor message = at::empty({layout.bytes}, at::TensorOptions(at::kByte).device(device));
  if (device.is_cpu()) {
    auto* bytes = static_cast<uint8_t*>(message.data_ptr());
    encode(header, reinterpret_cast<int64_t*>(bytes));
    for (const auto k : c10::irange(meta.dtypes.size())) {
      const at::Tensor& x = batch[k];
      if (layout.offsets[k] < 0 || x.numel() == 0) continue;  // undefined or no bytes
      if (x.is_contiguous() && !x.is_conj() && !x.is_neg()) {
        std::memcpy(bytes + layout.offsets[k], x.data_ptr(), x.nbytes());
      } else {
        view_bytes(message, layout.offsets[k], meta.dtypes[k], meta.shapes[k]).copy_(x);
      }
    }
  } else {
    message.narrow(0, 0, kHeaderBytes).copy_(encode(header).view(at::kByte));
    for (const auto k : c10::irange(meta.dtypes.size())) {
      if (layout.offsets[k] < 0) continue;  // undefined
      view_bytes(message, layout.offsets[k], meta.dtypes[k], meta.shapes[k]).copy_(batch[k]);
    }
  }
  return message;
}

std::vector<at::Tensor> unpack(const at::Tensor& message, const MessageMetadata& meta,
                               const MessageLayout& layout) {
  std::vector<at::Tensor> tensors;
  for (const auto k : c10::irange(meta.dtypes.size())) {
    if (meta.dtypes[k] == kUndefined) {
      tensors.emplace_back();
    } else {
      tensors.push_back(view_bytes(message, layout.offsets[k], meta.dtypes[k], meta.shapes[k]));
    }
  }
  return tensors;
}

Header decode(const int64_t* h, int64_t rank, int64_t peer) {
  TORCH_CHECK_VALUE(h[0] == kMagic, "rank ", rank, " received a message from rank ", peer,
                    " that is not a gpipe header: is rank ", peer, " running the same program?");
  Header header{h[1], h[2], h[3], h[4], {}, h[7] != 0, h[8]};
  header.meta.atomic = h[5] != 0;
  int64_t at = 9;
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

Header decode(const at::Tensor& received, int64_t rank, int64_t peer) {
  if (received.is_cpu())
    return decode(static_cast<const int64_t*>(received.data_ptr()), rank, peer);
  // A NCCL message's header is on its GPU.
  const at::Tensor header = received.narrow(0, 0, kHeaderBytes).to(at::kCPU);
  return decode(static_cast<const int64_t*>(header.data_ptr()), rank, peer);
}

}  // namespace distributed
}  // namespace gpipe

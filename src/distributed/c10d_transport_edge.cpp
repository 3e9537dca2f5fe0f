// TransportEdge: the bookkeeping of one edge of the c10d transport (c10d_transport_edge.h).
#include "distributed/c10d_transport_edge.h"

#include <algorithm>

namespace gpipe {
namespace distributed {

int64_t TransportEdge::posted_capacity(int64_t j) const {
  const int64_t known = j < window ? step_capacity : step_max[j - window];
  return std::max(known, kHeaderBytes);
}

void TransportEdge::record(int64_t bytes) {
  ++messages;
  if (bytes <= kMaxOneMessageBytes) capacity = std::max(capacity, bytes);
  step_max.push_back(capacity);
}

void TransportEdge::begin_step(int64_t receive_window) {
  agreed.reset();
  step_capacity = capacity;
  step_max.clear();
  unposted = 0;
  next_step = 0;
  window = messages == 0 ? 1 : receive_window;
}

}  // namespace distributed
}  // namespace gpipe

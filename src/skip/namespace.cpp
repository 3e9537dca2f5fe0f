#include "gpipe/skip/namespace.h"

#include <atomic>

namespace gpipe {
namespace skip {
namespace {

std::atomic<uint64_t> last_id{0};  // 0 is Namespace::none()

}  // namespace

Namespace::Namespace() : id_(++last_id) {}

std::ostream& operator<<(std::ostream& out, const Namespace& ns) {
  if (ns == Namespace::none()) return out << "<Namespace none>";
  return out << "<Namespace " << ns.id() << ">";
}

}  // namespace skip
}  // namespace gpipe

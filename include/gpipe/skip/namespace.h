// Namespace: isolates the skip names of reused modules, so that two layers may stash the same
// name when each pair of stash and pop lives in its own namespace (see Skippable::isolate).
//
// Thread safety: plain values; a new Namespace may be made on any thread.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>

namespace gpipe {
namespace skip {

/// A namespace of skip names. Every default-constructed Namespace differs from every other one;
/// copies compare equal. Names that were never isolated live in Namespace::none().
class Namespace {
 public:
  /// A new namespace, distinct from all others.
  Namespace();

  /// The namespace of names not isolated.
  static Namespace none() { return Namespace(0); }

  /// Orders namespaces (by creation) so that skip routes sort deterministically.
  uint64_t id() const { return id_; }

  friend bool operator==(const Namespace& a, const Namespace& b) { return a.id_ == b.id_; }
  friend bool operator!=(const Namespace& a, const Namespace& b) { return a.id_ != b.id_; }
  friend bool operator<(const Namespace& a, const Namespace& b) { return a.id_ < b.id_; }

 private:
  explicit Namespace(uint64_t id) : id_(id) {}

  uint64_t id_;
};

/// E.g. "<Namespace 3>", or "<Namespace none>".
std::ostream& operator<<(std::ostream& out, const Namespace& ns);

/// A skip name within its namespace: what a stash and its pop agree on.
using SkipKey = std::pair<Namespace, std::string>;

}  // namespace skip
}  // namespace gpipe

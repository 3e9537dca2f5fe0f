// The names of an enum's values, in one table per enum: what prints a value, parses a name and
// lists the values, so that the three never disagree.
//
// Thread safety: pure functions over constant tables.
#pragma once

#include <cstddef>
#include <optional>
#include <ostream>
#include <string>

namespace gpipe {
namespace detail {

/// One row of an enum's table.
template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;
};

/// `value`'s name in `names`, or nullptr where the table has no row for it.
template <typename Enum, size_t N>
const char* name_of(Enum value, const EnumName<Enum> (&names)[N]) {
  for (const auto& row : names) {
    if (row.value == value) return row.name;
  }
  return nullptr;
}

/// Prints `value`'s name, or `type(number)` for a value the table does not name.
template <typename Enum, size_t N>
std::ostream& print_name(std::ostream& out, Enum value, const EnumName<Enum> (&names)[N],
                         const char* type) {
  if (const char* name = name_of(value, names)) return out << name;
  return out << type << "(" << static_cast<int>(value) << ")";
}

/// The value named `name`, if any.
template <typename Enum, size_t N>
std::optional<Enum> value_named(const std::string& name, const EnumName<Enum> (&names)[N]) {
  for (const auto& row : names) {
    if (name == row.name) return row.value;
  }
  return std::nullopt;
}

}  // namespace detail
}  // namespace gpipe

// Numbers in trace files: fixed-point text with a set number of digits, the same in every locale.
#pragma once

#include <cstdio>
#include <string>

namespace gpipe {
namespace trace {

inline std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

}  // namespace trace
}  // namespace gpipe

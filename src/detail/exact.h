// Exact arithmetic on the counts a user gives (balance, chunks, stages): each may be anything an
// int64_t holds, so their sums and products are taken in 128 bits, where they cannot overflow,
// and errors print the true value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpipe {
namespace detail {

__extension__ typedef __int128 Exact;

inline Exact exact_sum(const std::vector<int64_t>& values) {
  Exact sum = 0;  // fewer than 2^64 terms of magnitude at most 2^63: within 2^127
  for (const int64_t value : values) sum += value;
  return sum;
}

inline std::string to_string(Exact value) {
  if (value == 0) return "0";
  const bool negative = value < 0;
  std::string digits;
  for (; value != 0; value /= 10) {
    const int digit = static_cast<int>(value % 10);
    digits.insert(digits.begin(), static_cast<char>('0' + (negative ? -digit : digit)));
  }
  return negative ? "-" + digits : digits;
}

}  // namespace detail
}  // namespace gpipe

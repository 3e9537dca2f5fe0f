// The message of an exception, without LibTorch's backtrace: what gpipe quotes inside its own
// one-line errors (LibTorch 2.x puts a stack trace in c10::Error::what()).
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace gpipe {
namespace detail {

inline std::string message_of(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

}  // namespace detail
}  // namespace gpipe

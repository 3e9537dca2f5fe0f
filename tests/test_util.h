// Helpers shared by the tests.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

// Expects `statement` to throw `ExceptionType` (e.g. c10::ValueError) whose message contains
// `substring`.
#define GPIPE_EXPECT_THROW_WITH(statement, ExceptionType, substring)                         \
  do {                                                                                       \
    try {                                                                                    \
      static_cast<void>(statement);                                                          \
      ADD_FAILURE() << "expected " #ExceptionType " from: " #statement;                      \
    } catch (const ExceptionType& error) {                                                   \
      EXPECT_THAT(std::string(error.what()), ::testing::HasSubstr(substring)) << #statement; \
    }                                                                                        \
  } while (false)

// Skips a *_CUDA test where LibTorch has no CUDA device.
#define GPIPE_REQUIRE_CUDA(count)                                   \
  do {                                                              \
    if (!torch::cuda::is_available() ||                             \
        torch::cuda::device_count() < static_cast<size_t>(count)) { \
      GTEST_SKIP() << (count) << " CUDA device(s) required";        \
    }                                                               \
  } while (false)

namespace gpipe {
namespace testing {

// True if both tensors are defined with the same shape and dtype and equal elements.
inline bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         torch::equal(a, b);
}

}  // namespace testing
}  // namespace gpipe

// Comparing the models `gpipe train --save` wrote, for the tests of the command.
#pragma once

#include "model_file.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace gpipe {
namespace testing {

/// The models saved at `actual` and `expected` have the same parameters, bit for bit.
inline void expect_same_model(const std::string& actual, const std::string& expected) {
  const auto a = cli::load_model(actual).model->parameters();
  const auto e = cli::load_model(expected).model->parameters();
  ASSERT_EQ(a.size(), e.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::equal(a[k], e[k])) << actual << ", parameter " << k;
  }
}

}  // namespace testing
}  // namespace gpipe

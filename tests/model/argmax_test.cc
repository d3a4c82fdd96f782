// Argmax (core/categorical.h), the greedy token everywhere. Built twice: in model_tests with this
// machine's SIMD, and as argmax_tests_avx2 without AVX-512, so that both intrinsic paths are
// checked on AVX-512 machines.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/categorical.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

// Argmax is std::max_element's answer on rows of every length around the 16-wide passes, with
// ties, -inf and NaN.
TEST(ArgmaxTest, IsTheFirstLargest) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<float> row(1 + rng() % 70);
    for (float& v : row) v = rng() % 5 == 0 ? -INFINITY : static_cast<float>(static_cast<int>(rng() % 9) - 4);
    ASSERT_EQ(Argmax(row), std::max_element(row.begin(), row.end()) - row.begin()) << "trial " << trial;
  }
  // Longer rows through the vector passes, with NaNs anywhere: the first largest of the rest.
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<float> row(1 + rng() % 300);
    for (float& v : row) {
      const uint32_t r = rng() % 10;
      v = r == 0 ? NAN : r == 1 ? -INFINITY : static_cast<float>(static_cast<int>(rng() % 9) - 4);
    }
    TokenId want = 0;
    float best = -INFINITY;
    for (size_t i = 0; i < row.size(); ++i) {
      if (row[i] > best) best = row[i], want = static_cast<TokenId>(i);
    }
    if (best == -INFINITY) {  // the first -inf, or 0 when every entry is NaN
      const auto it = std::find(row.begin(), row.end(), -INFINITY);
      want = it == row.end() ? 0 : static_cast<TokenId>(it - row.begin());
    }
    ASSERT_EQ(Argmax(row), want) << "long trial " << trial;
  }
  std::vector<float> vocab(32000, -1.0f);
  for (size_t at : {size_t{0}, size_t{15}, size_t{16}, size_t{17}, size_t{31999}}) {
    vocab[at] = 2.0f;
    EXPECT_EQ(Argmax(vocab), static_cast<TokenId>(at));
    vocab[at] = -1.0f;
  }
  EXPECT_EQ(Argmax(std::vector<float>{-INFINITY, -INFINITY}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{NAN, 1.0f, NAN, 3.0f, 2.0f}), 3);  // NaNs are skipped
  EXPECT_EQ(Argmax(std::vector<float>{NAN, NAN}), 0);
}

}  // namespace
}  // namespace specula

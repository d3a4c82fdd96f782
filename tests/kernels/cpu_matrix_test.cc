// The CPU backend's stored weight matrices (packed float32 and weight-only int8), against plain
// double-precision loops.
#include <cmath>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"

namespace specula {
namespace {

std::vector<float> Random(size_t n, std::mt19937* rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(*rng);
  return v;
}

// y[m, n] = x[m, k] w[n, k]^T + bias, in double.
std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w, const float* bias, int32_t m,
                              int32_t n, int32_t k) {
  std::vector<double> y(static_cast<size_t>(m) * n);
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t r = 0; r < n; ++r) {
      double t = bias != nullptr ? bias[r] : 0.0;
      for (int32_t j = 0; j < k; ++j) t += static_cast<double>(x[i * k + j]) * w[static_cast<size_t>(r) * k + j];
      y[static_cast<size_t>(i) * n + r] = t;
    }
  }
  return y;
}

struct Shape {
  int32_t m, n, k;
};
// Single tokens, verification-sized runs, a token tile and a half, decode batches and prefill
// chunks; rows below, at and past the packed groups of 64 and the row-major cut at 1024; k below
// and across the 256-wide k chunks; token counts that split into uneven blocks.
const Shape kShapes[] = {{1, 1, 1},     {1, 17, 7},     {1, 1100, 300}, {2, 64, 64},    {5, 1024, 288},
                         {5, 100, 33},  {6, 2000, 130}, {7, 1030, 600}, {8, 288, 288},  {9, 65, 257},
                         {13, 130, 40}, {32, 288, 288}, {32, 1100, 768}, {37, 70, 50},   {100, 129, 513},
                         {200, 768, 288}, {543, 288, 768}};

TEST(CpuPackedMatrixTest, LinearMatchesReference) {
  auto be = MakeCpuBackend();
  std::mt19937 rng(1);
  for (const Shape& s : kShapes) {
    for (bool with_bias : {false, true}) {
      const std::vector<float> x = Random(static_cast<size_t>(s.m) * s.k, &rng), w = Random(static_cast<size_t>(s.n) * s.k, &rng),
                               b = Random(s.n, &rng);
      auto up = be->UploadMatrix(w.data(), s.n, s.k);
      ASSERT_TRUE(up.ok());
      std::vector<float> y(static_cast<size_t>(s.m) * s.n, NAN);
      be->Linear(x.data(), *up, with_bias ? b.data() : nullptr, s.m, s.n, s.k, y.data());
      const std::vector<double> want = Reference(x, w, with_bias ? b.data() : nullptr, s.m, s.n, s.k);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_NEAR(y[i], want[i], 1e-4 * std::sqrt(s.k) + 1e-5)
            << "m " << s.m << " n " << s.n << " k " << s.k << " bias " << with_bias << " at " << i;
      }
      if (!with_bias) {  // LinearF32 is the same product
        std::vector<float> y32(y.size(), NAN);
        be->LinearF32(x.data(), *up, s.m, s.n, s.k, y32.data());
        EXPECT_EQ(0, std::memcmp(y.data(), y32.data(), y.size() * sizeof(float))) << "m " << s.m << " n " << s.n;
      }
    }
  }
}

TEST(CpuPackedMatrixTest, MultiLinearAndGatherMatchTheRowMajorWeights) {
  auto be = MakeCpuBackend();
  std::mt19937 rng(2);
  const int32_t k = 96, n0 = 1100, n1 = 70;
  const std::vector<float> w0 = Random(static_cast<size_t>(n0) * k, &rng), w1 = Random(static_cast<size_t>(n1) * k, &rng),
                           b1 = Random(n1, &rng);
  const void* p0 = *be->UploadMatrix(w0.data(), n0, k);
  const void* p1 = *be->UploadMatrix(w1.data(), n1, k);
  for (int32_t m : {1, 3, 20}) {
    const std::vector<float> x = Random(static_cast<size_t>(m) * k, &rng);
    std::vector<float> y0(static_cast<size_t>(m) * n0, NAN), y1(static_cast<size_t>(m) * n1, NAN);
    const Backend::LinearOut outs[] = {{p0, nullptr, n0, y0.data()}, {p1, b1.data(), n1, y1.data()}};
    be->MultiLinear(x.data(), m, k, outs, 2);
    const std::vector<double> want0 = Reference(x, w0, nullptr, m, n0, k), want1 = Reference(x, w1, b1.data(), m, n1, k);
    for (size_t i = 0; i < y0.size(); ++i) ASSERT_NEAR(y0[i], want0[i], 1e-4) << "m " << m << " at " << i;
    for (size_t i = 0; i < y1.size(); ++i) ASSERT_NEAR(y1[i], want1[i], 1e-4) << "m " << m << " at " << i;
    // Small matrices only.
    std::fill(y1.begin(), y1.end(), NAN);
    const Backend::LinearOut small[] = {{p1, b1.data(), n1, y1.data()}, {p1, nullptr, n1, y0.data()}};
    be->MultiLinear(x.data(), m, k, small, 2);
    const std::vector<double> want2 = Reference(x, w1, nullptr, m, n1, k);
    for (int32_t i = 0; i < m * n1; ++i) {
      ASSERT_NEAR(y1[i], want1[i], 1e-4) << "m " << m << " at " << i;
      ASSERT_NEAR(y0[i], want2[i], 1e-4) << "m " << m << " at " << i;
    }
  }
  // The embedding lookup reads a packed table back exactly.
  const int32_t ids[] = {0, 1099, 63, 64, 700};
  std::vector<float> rows(5 * k, NAN);
  be->EmbeddingGather(p0, k, ids, 5, rows.data());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(0, std::memcmp(rows.data() + i * k, w0.data() + static_cast<size_t>(ids[i]) * k, k * sizeof(float)))
        << "row " << ids[i];
  }
}

// Batch invariance: a token's output is the same bits whatever else is in its batch (one token,
// a verification run, a decode batch, a prefill chunk) and whether its matrix is multiplied alone or
// together with others. Greedy speculative decoding and a bf16 KV cache depend on it.
TEST(CpuMatrixTest, TokensGetTheSameBitsInEveryBatch) {
  auto be = MakeCpuBackend();
  std::mt19937 rng(7);
  for (const Shape& s : {Shape{0, 288, 288}, Shape{0, 70, 50}, Shape{0, 1100, 300}, Shape{0, 33, 768}}) {
    const std::vector<float> w = Random(static_cast<size_t>(s.n) * s.k, &rng), b = Random(s.n, &rng),
                             w2 = Random(static_cast<size_t>(s.n) * s.k, &rng);
    const void* p = *be->UploadMatrix(w.data(), s.n, s.k);
    const void* p2 = *be->UploadMatrix(w2.data(), s.n, s.k);
    const int32_t big = 200;
    const std::vector<float> x = Random(static_cast<size_t>(big) * s.k, &rng);
    std::vector<float> all(static_cast<size_t>(big) * s.n), other(all.size());
    be->Linear(x.data(), p, b.data(), big, s.n, s.k, all.data());
    for (int32_t m : {1, 2, 5, 8, 9, 13, 32, 97}) {
      for (int32_t start : {0, 3, big - m}) {
        std::vector<float> y(static_cast<size_t>(m) * s.n, NAN), y2(y.size(), NAN);
        be->Linear(x.data() + static_cast<size_t>(start) * s.k, p, b.data(), m, s.n, s.k, y.data());
        ASSERT_EQ(0, std::memcmp(y.data(), all.data() + static_cast<size_t>(start) * s.n, y.size() * sizeof(float)))
            << "n " << s.n << " k " << s.k << ": " << m << " tokens from " << start << " differ from the same tokens among " << big;
        std::fill(y.begin(), y.end(), NAN);
        const Backend::LinearOut outs[] = {{p2, nullptr, s.n, y2.data()}, {p, b.data(), s.n, y.data()}};
        be->MultiLinear(x.data() + static_cast<size_t>(start) * s.k, m, s.k, outs, 2);
        ASSERT_EQ(0, std::memcmp(y.data(), all.data() + static_cast<size_t>(start) * s.n, y.size() * sizeof(float)))
            << "n " << s.n << " k " << s.k << ": MultiLinear of " << m << " tokens differs from Linear";
      }
    }
  }
}

// SiluMul against the formula in double, and the same bits for an element whether it falls in a
// vector or in the scalar tail: a row of 1540 (a multiple of neither 8 nor 16) alone ends in the
// tail, and as the first of two rows it does not. Batch invariance (greedy speculation equal to plain
// decoding) needs the two paths to agree.
TEST(CpuActivationTest, SiluMulMatchesTheFormulaAndItsTailGivesTheVectorBits) {
  auto be = MakeCpuBackend();
  constexpr int32_t d = 1540;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  std::vector<float> gate(2 * d), up(2 * d), one(d), two(2 * d);
  for (int32_t i = 0; i < d; ++i) gate[i] = gate[d + i] = u(rng), up[i] = up[d + i] = u(rng);
  gate[0] = gate[d] = 0.0f;
  gate[d - 1] = gate[2 * d - 1] = -100.0f;  // exp(100): clamped to exp(88), so silu(-100) is ~0
  be->SiluMul(gate.data(), up.data(), d, one.data());
  be->SiluMul(gate.data(), up.data(), 2 * d, two.data());
  for (int32_t i = 0; i < d; ++i) {
    const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_NEAR(one[i], want, 1e-6 * std::max(1.0, std::abs(want))) << "element " << i << " gate " << g;
    uint32_t a, b;
    std::memcpy(&a, &one[i], 4);
    std::memcpy(&b, &two[i], 4);
    ASSERT_EQ(a, b) << "element " << i << ": alone " << one[i] << ", first of two rows " << two[i];
  }
}

// The element-wise ops split a batch's rows (SiluMul: pieces of its elements) over both cores once
// there are enough (these runs have 2 OpenMP threads): every row of a batch must get the bits it
// gets alone, on one thread. 64 rows of 288 and of 1540 are past the split's threshold.
TEST(CpuElementwiseTest, BatchedRowsGetTheBitsOfRowsAlone) {
  auto be = MakeCpuBackend();
  std::mt19937 rng(13);
  constexpr int32_t m = 64, d = 288, heads = 6, hd = 48, hid = 1540;
  auto same = [](const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; };
  const std::vector<float> x = Random(static_cast<size_t>(m) * d, &rng), delta = Random(x.size(), &rng),
                           w = Random(d, &rng);
  std::vector<float> all(x.size()), one(d);
  be->RmsNorm(x.data(), w.data(), m, d, 1e-5f, all.data());
  for (int32_t i = 0; i < m; ++i) {
    be->RmsNorm(x.data() + i * d, w.data(), 1, d, 1e-5f, one.data());
    ASSERT_TRUE(same(one.data(), all.data() + i * d, d)) << "RmsNorm row " << i;
  }
  std::vector<float> xs = x, ys(x.size());
  be->AddRmsNorm(xs.data(), delta.data(), w.data(), m, d, 1e-5f, ys.data());
  for (int32_t i = 0; i < m; ++i) {
    std::vector<float> xr(x.begin() + i * d, x.begin() + (i + 1) * d);
    be->AddRmsNorm(xr.data(), delta.data() + i * d, w.data(), 1, d, 1e-5f, one.data());
    ASSERT_TRUE(same(xr.data(), xs.data() + i * d, d)) << "AddRmsNorm residual row " << i;
    ASSERT_TRUE(same(one.data(), ys.data() + i * d, d)) << "AddRmsNorm row " << i;
  }
  const std::vector<float> cos_sin = Random(static_cast<size_t>(m) * hd, &rng);  // [positions, hd]
  std::vector<int32_t> positions(m);
  for (int32_t& p : positions) p = static_cast<int32_t>(rng() % m);
  for (bool interleaved : {false, true}) {
    const RopeParams rope{hd, interleaved, cos_sin.data()};
    std::vector<float> q = x;  // [m, heads, hd]
    be->Rope(q.data(), positions.data(), m, heads, rope);
    for (int32_t i = 0; i < m; ++i) {
      std::vector<float> qr(x.begin() + i * d, x.begin() + (i + 1) * d);
      be->Rope(qr.data(), &positions[i], 1, heads, rope);
      ASSERT_TRUE(same(qr.data(), q.data() + i * d, d)) << "Rope row " << i << " interleaved " << interleaved;
    }
  }
  const std::vector<float> gate = Random(static_cast<size_t>(m) * hid, &rng, 4.0f), up = Random(gate.size(), &rng);
  std::vector<float> act(gate.size()), act_one(hid);
  be->SiluMul(gate.data(), up.data(), static_cast<int64_t>(m) * hid, act.data());
  for (int32_t i = 0; i < m; ++i) {
    be->SiluMul(gate.data() + i * hid, up.data() + i * hid, hid, act_one.data());
    ASSERT_TRUE(same(act_one.data(), act.data() + i * hid, hid)) << "SiluMul row " << i;
  }
  const int32_t vocab = 500;
  const std::vector<float> table = Random(static_cast<size_t>(vocab) * d, &rng);
  const void* packed = *be->UploadMatrix(table.data(), vocab, d);
  std::vector<int32_t> ids(m);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
  std::vector<float> rows(x.size(), NAN);
  be->EmbeddingGather(packed, d, ids.data(), m, rows.data());
  for (int32_t i = 0; i < m; ++i) {
    ASSERT_TRUE(same(rows.data() + i * d, table.data() + static_cast<size_t>(ids[i]) * d, d)) << "gathered row " << i;
  }
}

// Weight-only int8 (and, where VNNI is compiled in, int8 activations for up to 8 tokens): each
// output within the worst case of the two roundings, and on average within 3% of the output scale
// (two roundings of a step of max/127 each, on Gaussian data, come to about 1%).
TEST(CpuInt8MatrixTest, LinearWithinQuantizationError) {
  auto be = MakeCpuBackend({/*int8_weights=*/true});
  std::mt19937 rng(3);
  for (const Shape& s : kShapes) {
    const std::vector<float> x = Random(static_cast<size_t>(s.m) * s.k, &rng), w = Random(static_cast<size_t>(s.n) * s.k, &rng, 0.05f),
                             b = Random(s.n, &rng);
    auto up = be->UploadMatrix(w.data(), s.n, s.k);
    ASSERT_TRUE(up.ok());
    std::vector<float> y(static_cast<size_t>(s.m) * s.n, NAN);
    be->Linear(x.data(), *up, b.data(), s.m, s.n, s.k, y.data());
    const std::vector<double> want = Reference(x, w, b.data(), s.m, s.n, s.k);
    double err_sum = 0, ref_sum = 0;
    for (int32_t i = 0; i < s.m; ++i) {
      float xmax = 0;
      for (int32_t j = 0; j < s.k; ++j) xmax = std::max(xmax, std::fabs(x[i * s.k + j]));
      for (int32_t r = 0; r < s.n; ++r) {
        float wmax = 0;
        for (int32_t j = 0; j < s.k; ++j) wmax = std::max(wmax, std::fabs(w[static_cast<size_t>(r) * s.k + j]));
        const double sw = wmax / 127.0, sx = xmax / 127.0;
        const double bound = s.k * (0.5 * sw * xmax + 0.5 * sx * wmax + 0.25 * sw * sx) + 1e-4;
        const size_t at = static_cast<size_t>(i) * s.n + r;
        ASSERT_NEAR(y[at], want[at], bound) << "m " << s.m << " n " << s.n << " k " << s.k << " token " << i << " row " << r;
        err_sum += std::fabs(y[at] - want[at]);
        ref_sum += std::fabs(want[at] - b[r]);
      }
    }
    if (s.k >= 32) {
      EXPECT_LT(err_sum, 0.03 * ref_sum) << "m " << s.m << " n " << s.n << " k " << s.k;
    }
  }
}

TEST(CpuInt8MatrixTest, GatherDequantizesEachRow) {
  auto be = MakeCpuBackend({true});
  std::mt19937 rng(4);
  const int32_t n = 50, k = 40;
  const std::vector<float> w = Random(static_cast<size_t>(n) * k, &rng);
  const void* p = *be->UploadMatrix(w.data(), n, k);
  const int32_t ids[] = {49, 0, 7};
  std::vector<float> rows(3 * k);
  be->EmbeddingGather(p, k, ids, 3, rows.data());
  for (int i = 0; i < 3; ++i) {
    float wmax = 0;
    for (int32_t j = 0; j < k; ++j) wmax = std::max(wmax, std::fabs(w[ids[i] * k + j]));
    for (int32_t j = 0; j < k; ++j) ASSERT_NEAR(rows[i * k + j], w[ids[i] * k + j], 0.5 * wmax / 127 + 1e-7) << ids[i];
  }
}

}  // namespace
}  // namespace specula

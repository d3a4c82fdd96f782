// Products on GGUF blocks (kernels/cpu/quant_gemm.h) against double-precision loops over
// DequantizeRow's values: every weight type, in GGUF's arrangement and (Q4_1, Q8_0) in the one the
// CPU backend multiplies (RepackForProducts' row tiles), one token to a prefill chunk, SmolLM2's row
// lengths (576, 1536) and lengths that end in a partial unit of the kernels, row counts off every
// vector width and tile, weights at odd addresses (as rows of a mapped GGUF file are).
#include "kernels/cpu/quant_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "gtest/gtest.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/tile_gemm.h"

namespace specula::cpu {
namespace {

std::vector<float> Random(size_t n, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(*rng);
  return v;
}

// A weight tensor's bytes, `offset` bytes into its storage (odd for the block types: nothing but
// the tensor's start is aligned in a GGUF file; 2 for F16/BF16, whose elements are 2-byte aligned).
struct Weights {
  std::vector<uint8_t> storage;
  QuantMatrix w;
};

template <typename Block, typename Quantize>
std::vector<uint8_t> QuantizeRows(const std::vector<float>& f, int64_t n, int64_t k, Quantize quantize) {
  std::vector<Block> blocks(static_cast<size_t>(n * k / kQK));
  for (int64_t r = 0; r < n; ++r) quantize(f.data() + r * k, k, blocks.data() + r * k / kQK);
  std::vector<uint8_t> bytes(blocks.size() * sizeof(Block));
  std::memcpy(bytes.data(), blocks.data(), bytes.size());
  return bytes;
}

// Q4_0, Q4_1, Q8_0: random floats through the reference quantizers (a few Q8_0 values -128, which a
// file may hold though the quantizer never writes it). Q4_K, Q6_K: random bytes with an f16 d in
// [0.001, 0.05]. F16, BF16: random floats converted. `repacked`: in RepackForProducts' arrangement.
Weights MakeWeights(QuantType type, int64_t n, int64_t k, std::mt19937* rng, bool repacked = false) {
  const std::vector<float> f = Random(static_cast<size_t>(n * k), rng);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::vector<uint8_t> bytes;
  switch (type) {
    case QuantType::kQ4_0: bytes = QuantizeRows<BlockQ4_0>(f, n, k, QuantizeRowQ4_0); break;
    case QuantType::kQ4_1: bytes = QuantizeRows<BlockQ4_1>(f, n, k, QuantizeRowQ4_1); break;
    case QuantType::kQ8_0:
      bytes = QuantizeRows<BlockQ8_0>(f, n, k, QuantizeRowQ8_0);
      for (size_t b = 0; b < bytes.size(); b += 5 * sizeof(BlockQ8_0)) bytes[b + offsetof(BlockQ8_0, qs) + 7] = 0x80;
      break;
    case QuantType::kQ4_K:
    case QuantType::kQ6_K: {
      bytes.resize(static_cast<size_t>(QuantRowBytes(type, k) * n));
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(*rng));
      const bool q4k = type == QuantType::kQ4_K;
      const size_t block = q4k ? sizeof(BlockQ4_K) : sizeof(BlockQ6_K);
      for (size_t b = 0; b < bytes.size(); b += block) {
        const uint16_t d = F32ToF16(scale(*rng)), dmin = F32ToF16(scale(*rng));
        std::memcpy(&bytes[b + (q4k ? offsetof(BlockQ4_K, d) : offsetof(BlockQ6_K, d))], &d, 2);
        if (q4k) std::memcpy(&bytes[b + offsetof(BlockQ4_K, dmin)], &dmin, 2);
      }
      break;
    }
    case QuantType::kF16:
    case QuantType::kBF16:
      bytes.resize(static_cast<size_t>(n * k * 2));
      for (size_t i = 0; i < f.size(); ++i) {
        const uint16_t h = type == QuantType::kF16 ? F32ToF16(f[i]) : F32ToBf16(f[i]);
        std::memcpy(&bytes[2 * i], &h, 2);
      }
      break;
    default: ADD_FAILURE() << "no test weights for " << QuantTypeName(type);
  }
  const size_t offset = type == QuantType::kF16 || type == QuantType::kBF16 ? 2 : 1;
  Weights out;
  out.storage.resize(bytes.size() + offset);
  std::memcpy(out.storage.data() + offset, bytes.data(), bytes.size());
  out.w = QuantMatrix{out.storage.data() + offset, type, n, k};
  if (repacked) {
    out.storage = RepackForProducts(out.w);
    EXPECT_FALSE(out.storage.empty()) << QuantTypeName(type) << " has no arrangement of its own";
    out.w.blocks = out.storage.data();
    out.w.repacked = true;
  }
  return out;
}

// dequant(w)[n, k], the reference values.
std::vector<float> Dequantized(const QuantMatrix& w) {
  std::vector<float> f(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) QuantRow(w, r, f.data() + r * w.cols);
  return f;
}

// y[m, n] = x[m, k] wf[n, k]^T + bias, in double.
std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& wf, const float* bias, int32_t m,
                              int32_t n, int32_t k) {
  std::vector<double> y(static_cast<size_t>(m) * n);
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t r = 0; r < n; ++r) {
      double t = bias != nullptr ? bias[r] : 0.0;
      const float* xi = x.data() + static_cast<size_t>(i) * k;
      const float* wr = wf.data() + static_cast<size_t>(r) * k;
      for (int32_t j = 0; j < k; ++j) t += static_cast<double>(xi[j]) * wr[j];
      y[static_cast<size_t>(i) * n + r] = t;
    }
  }
  return y;
}

// Sums of squares of y - ref and of ref, for ||y - ref|| / ||ref|| over several products.
struct ErrorNorm {
  double diff = 0.0, ref = 0.0;
  void Add(const std::vector<float>& y, const std::vector<double>& want) {
    for (size_t i = 0; i < y.size(); ++i) {
      diff += (y[i] - want[i]) * (y[i] - want[i]);
      ref += want[i] * want[i];
    }
  }
  double Relative() const { return std::sqrt(diff / ref); }
};

bool AllFinite(const std::vector<float>& y) {
  return std::all_of(y.begin(), y.end(), [](float v) { return std::isfinite(v); });
}

struct Case {
  QuantType type;
  bool repacked;  // in RepackForProducts' arrangement (SIMD builds only)
  // Bound on ||y - ref|| / ||ref|| over the products of one matrix (every m). The integer types
  // quantize each activation to 8 bits per group of 32 (16 for Q6_K) with step d = amax / 127: a
  // rounding error of rms d / sqrt(12), about 0.47% of a normal activation's rms for groups of 32
  // (amax ~ 2.07 sigma) and 0.40% for 16, which carries into the products at the same relative
  // size: measured 4.3-5.6e-3 on the 17- and 67-row matrices, up to 7.6e-3 (Q4_K; Q4_0 6.0e-3,
  // Q4_1 5.9e-3, Q8_0 6.3e-3, Q6_K 5.8e-3) on the 1-row ones, whose 63 outputs make a noisier norm;
  // the same with AVX-512 and AVX2. IntegerPathsMatchQuantizedActivations below shows that this is
  // all activation rounding. F16 and BF16 multiply float activations: float rounding only
  // (measured <= 2.3e-7).
  double tolerance;
  std::vector<int32_t> ks;  // row lengths: SmolLM2's and ones that end in a partial unit
};
const Case kCases[] = {
    {QuantType::kQ4_0, false, 1e-2, {32, 544, 576, 1536}},
    {QuantType::kQ4_1, false, 1e-2, {32, 544, 576, 1536}},
    {QuantType::kQ8_0, false, 1e-2, {32, 544, 576, 1536}},
    {QuantType::kQ4_K, false, 1e-2, {256, 768, 1536}},
    {QuantType::kQ6_K, false, 1e-2, {256, 768, 1536}},
    {QuantType::kF16, false, 1e-5, {40, 576, 1536}},
    {QuantType::kBF16, false, 1e-5, {40, 576, 1536}},
#if defined(__AVX2__)
    {QuantType::kQ4_1, true, 1e-2, {32, 544, 576, 1536}},
    {QuantType::kQ8_0, true, 1e-2, {32, 544, 576, 1536}},
#endif
};
std::string Name(const Case& c) { return std::string(QuantTypeName(c.type)) + (c.repacked ? " repacked" : ""); }
const int32_t kTokenCounts[] = {1, 2, 3, 7, 8, 9, 33};
const int32_t kRowCounts[] = {1, 17, 67};

TEST(QuantGemmTest, MatchesDequantizedReference) {
  std::mt19937 rng(1);
  for (const bool two_term : {true, false}) {
  for (const Case& c : kCases) {
    // Two 8-bit terms leave the second term's rounding, ~1/127 of one term's (measured <= 2.4e-5).
    const double tolerance = two_term && c.tolerance > 1e-4 ? 1e-4 : c.tolerance;
    double worst = 0.0;
    for (int32_t k : c.ks) {
      for (int32_t n : kRowCounts) {
        Weights w = MakeWeights(c.type, n, k, &rng, c.repacked);
        w.w.two_term_activations = two_term;
        const std::vector<float> wf = Dequantized(w.w), bias = Random(n, &rng);
        ErrorNorm err;  // over every m: a single output's relative error says little
        for (int32_t m : kTokenCounts) {
          const std::vector<float> x = Random(static_cast<size_t>(m) * k, &rng);
          std::vector<float> y(static_cast<size_t>(m) * n, NAN);
          LinearQuant(x.data(), w.w, nullptr, m, n, k, y.data());
          ASSERT_TRUE(AllFinite(y)) << Name(c) << " m " << m << " n " << n << " k " << k;
          err.Add(y, Reference(x, wf, nullptr, m, n, k));
          // The bias is added to the same sums.
          std::vector<float> yb(y.size(), NAN);
          LinearQuant(x.data(), w.w, bias.data(), m, n, k, yb.data());
          for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_EQ(yb[i], y[i] + bias[i % n]) << Name(c) << " m " << m << " n " << n << " at " << i;
          }
        }
        worst = std::max(worst, err.Relative());
        EXPECT_LE(err.Relative(), tolerance) << Name(c) << " n " << n << " k " << k << " two-term "
                                             << two_term;
      }
    }
    std::printf("[ %s, %s ] worst relative error %.2e (bound %.0e)\n", Name(c).c_str(),
                two_term ? "two-term activations" : "8-bit activations", worst, tolerance);
  }
  }
}

// A token's outputs are the same bits whatever the tokens around it: one at a time, or among 33
// (blocks of equal size up to 16 activation rows, row tiles). The engine's batched and unbatched
// steps rely on it.
TEST(QuantGemmTest, TokensGetTheSameBitsInEveryBatch) {
  std::mt19937 rng(2);
  for (const Case& c : kCases) {
    const int32_t n = 37, k = c.ks.back(), big = 33;
    const Weights w = MakeWeights(c.type, n, k, &rng, c.repacked);
    const std::vector<float> x = Random(static_cast<size_t>(big) * k, &rng), bias = Random(n, &rng);
    std::vector<float> all(static_cast<size_t>(big) * n, NAN);
    LinearQuant(x.data(), w.w, bias.data(), big, n, k, all.data());
    for (int32_t m : {1, 3, 8, 9, 16, 17}) {
      for (int32_t start : {0, 5, big - m}) {
        std::vector<float> y(static_cast<size_t>(m) * n, NAN);
        LinearQuant(x.data() + static_cast<size_t>(start) * k, w.w, bias.data(), m, n, k, y.data());
        ASSERT_EQ(0, std::memcmp(y.data(), all.data() + static_cast<size_t>(start) * n, y.size() * sizeof(float)))
            << Name(c) << ": " << m << " tokens from " << start << " differ from the same among " << big;
      }
    }
  }
}

// Several matrices in one pass (Q, K, V; gate and up) give each one's LinearQuant bits, with one or
// two activation terms and with or without biases; matrices of different types go one at a time.
TEST(QuantGemmTest, MultiGivesEachMatrixItsOwnBits) {
  std::mt19937 rng(5);
  for (const Case& c : kCases) {
    const int32_t k = c.ks.back();
    for (bool two_terms : {false, true}) {
      for (int32_t m : {1, 5, 33}) {
        // Different row counts (a partial tile each); the last matrix is Q8_0 in the mixed case.
        std::vector<Weights> ws;
        for (int32_t n : {37, 16, 5}) ws.push_back(MakeWeights(c.type, n, k, &rng, c.repacked));
        for (bool mixed : {false, true}) {
          if (mixed) ws.back() = MakeWeights(QuantType::kQ8_0, 9, k, &rng);
          const std::vector<float> x = Random(static_cast<size_t>(m) * k, &rng), bias = Random(37, &rng);
          std::vector<std::vector<float>> y(ws.size());
          std::vector<QuantOut> outs;
          for (size_t i = 0; i < ws.size(); ++i) {
            ws[i].w.two_term_activations = two_terms;
            y[i].assign(static_cast<size_t>(m) * ws[i].w.rows, NAN);
            outs.push_back({&ws[i].w, i == 1 ? nullptr : bias.data(), y[i].data()});
          }
          LinearQuantMulti(x.data(), m, k, outs.data(), static_cast<int32_t>(outs.size()));
          for (size_t i = 0; i < ws.size(); ++i) {
            const int32_t n = static_cast<int32_t>(ws[i].w.rows);
            std::vector<float> one(y[i].size(), NAN);
            LinearQuant(x.data(), ws[i].w, outs[i].bias, m, n, k, one.data());
            ASSERT_EQ(0, std::memcmp(one.data(), y[i].data(), one.size() * sizeof(float)))
                << Name(c) << " matrix " << i << " of " << ws.size() << ", " << m << " tokens, "
                << (two_terms ? "two terms" : "one term") << (mixed ? ", mixed types" : "");
          }
        }
      }
    }
  }
}

// Q4_1 and Q8_0 repacked for the products (row tiles) hold the same matrix: the embedding lookup
// gives the same bits, and the products (the same integer dot products, summed in another order) the
// same values to float rounding, with one and two activation terms at every token count, alone and
// in one pass with another matrix. A permutation that differed would move some group's values or
// scales.
TEST(QuantGemmTest, RepackedIsTheSameMatrix) {
  std::mt19937 rng(6);
  for (QuantType type : {QuantType::kQ4_1, QuantType::kQ8_0}) {
    double worst = 0.0;
    for (int32_t k : {32, 512, 544, 576, 1536}) {
      SCOPED_TRACE(QuantTypeName(type));
      const int32_t n = 21;
      Weights w = MakeWeights(type, n, k, &rng);
      std::vector<uint8_t> packed = RepackForProducts(w.w);
#if !defined(__AVX2__)
      EXPECT_TRUE(packed.empty()) << "the scalar build has no arrangement of its own";
      continue;
#endif
      // Tiles of 16 rows (AVX-512; 8 with AVX2, which this file's flags do not tell), the last one
      // padded.
      const auto size = [&](int64_t lanes) {
        return static_cast<size_t>((n + lanes - 1) / lanes * lanes * QuantRowBytes(type, k));
      };
      ASSERT_TRUE(packed.size() == size(16) || packed.size() == size(8)) << "k " << k << ": " << packed.size() << " bytes";
      EXPECT_NE(0, std::memcmp(packed.data(), w.w.blocks, QuantRowBytes(type, k) * n)) << "k " << k << ": nothing moved";
      QuantMatrix r = w.w;
      r.blocks = packed.data();
      r.repacked = true;
      EXPECT_TRUE(RepackForProducts(r).empty()) << "repacked twice";
      for (bool two_terms : {false, true}) {
        w.w.two_term_activations = r.two_term_activations = two_terms;
        for (int32_t m : {1, 2, 5, 9, 33, 40}) {
          const std::vector<float> x = Random(static_cast<size_t>(m) * k, &rng), bias = Random(n, &rng);
          std::vector<float> want(static_cast<size_t>(m) * n, NAN), got(want.size(), NAN);
          LinearQuant(x.data(), w.w, bias.data(), m, n, k, want.data());
          LinearQuant(x.data(), r, bias.data(), m, n, k, got.data());
          const std::string what = "k " + std::to_string(k) + ", " + std::to_string(m) + " tokens, " +
                                   (two_terms ? "two terms" : "one term");
          ErrorNorm err;  // float rounding of sums of up to 48 blocks
          err.Add(got, std::vector<double>(want.begin(), want.end()));
          worst = std::max(worst, err.Relative());
          ASSERT_LE(err.Relative(), 1e-6) << what;
          std::vector<float> multi(want.size(), NAN), other(want.size(), NAN);
          const QuantOut outs[] = {{&r, bias.data(), multi.data()}, {&r, nullptr, other.data()}};
          LinearQuantMulti(x.data(), m, k, outs, 2);
          ASSERT_EQ(0, std::memcmp(got.data(), multi.data(), got.size() * sizeof(float))) << what << ", in one pass";
        }
      }
      std::vector<float> want(k), got(k);
      for (int64_t row : {0, n / 2, n - 1}) {
        QuantRow(w.w, row, want.data());
        QuantRow(r, row, got.data());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), k * sizeof(float))) << "k " << k << " row " << row;
      }
    }
    std::printf("[ %s ] repacked against GGUF's arrangement: relative difference %.2e (bound 1e-6)\n",
                QuantTypeName(type), worst);
  }
}

// The integer machinery alone: against activations quantized the way the kernels document (per
// group of 32, 16 for Q6_K; scale amax / 127; round to nearest even), the products agree to float
// rounding. This sees errors that the 8-bit noise above could hide (one group's scale or offset
// wrong). SIMD builds only: the scalar fallback multiplies float activations.
#if defined(__AVX2__)
TEST(QuantGemmTest, IntegerPathsMatchQuantizedActivations) {
  std::mt19937 rng(3);
  for (const Case& c : kCases) {
    if (c.type == QuantType::kF16 || c.type == QuantType::kBF16) continue;
    const int group = c.type == QuantType::kQ6_K ? 16 : 32;
    for (int32_t k : c.ks) {
      const int32_t n = 19, m = 9;
      Weights w = MakeWeights(c.type, n, k, &rng, c.repacked);
      w.w.two_term_activations = false;  // one 8-bit term: exactly xq below
      const std::vector<float> wf = Dequantized(w.w), x = Random(static_cast<size_t>(m) * k, &rng);
      std::vector<float> xq(x.size());  // the activations as the kernels see them
      for (size_t g = 0; g < x.size(); g += group) {
        float amax = 0.0f;
        for (int j = 0; j < group; ++j) amax = std::max(amax, std::fabs(x[g + j]));
        for (int j = 0; j < group; ++j) xq[g + j] = std::nearbyint(x[g + j] * (127.0f / amax)) * (amax / 127.0f);
      }
      std::vector<float> y(static_cast<size_t>(m) * n, NAN);
      LinearQuant(x.data(), w.w, nullptr, m, n, k, y.data());
      ErrorNorm err;
      err.Add(y, Reference(xq, wf, nullptr, m, n, k));
      EXPECT_LE(err.Relative(), 1e-5) << Name(c) << " k " << k;
    }
  }
}
#endif

// The embedding lookup gives DequantizeRow's values, bit for bit (RepackedIsTheSameMatrix checks
// the other arrangements' rows).
TEST(QuantGemmTest, RowIsDequantizeRow) {
  std::mt19937 rng(4);
  for (const Case& c : kCases) {
    if (c.repacked) continue;
    const int32_t n = 9, k = c.ks.back();
    const Weights w = MakeWeights(c.type, n, k, &rng, c.repacked);
    const int64_t row_bytes = QuantRowBytes(c.type, k);
    for (int64_t r : {0, 4, 8}) {
      std::vector<float> got(k, NAN), want(k, NAN);
      QuantRow(w.w, r, got.data());
      DequantizeRow(c.type, static_cast<const uint8_t*>(w.w.blocks) + r * row_bytes, k, want.data());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), k * sizeof(float))) << Name(c) << " row " << r;
    }
  }
}

// The row tiles' products on `engine` (tile_gemm.h) give the vector path's bits: Q4_1 and Q8_0,
// alone and two in one pass, with one and two activation terms, at token counts around AMX's 16
// rows and its threshold, row counts off the 16-row tile, and SmolLM2's row lengths.
void ExpectVectorBits(TileEngine engine) {
  const TileEngine before = CurrentTileEngine();
  std::mt19937 rng(7);
  for (QuantType type : {QuantType::kQ4_1, QuantType::kQ8_0}) {
    for (int32_t k : {32, 576, 1536}) {
      for (int32_t n : {5, 16, 37}) {
        Weights w = MakeWeights(type, n, k, &rng, /*repacked=*/true);
        for (int32_t m : {1, 2, 3, 4, 5, 8, 15, 16, 17, 40}) {
          w.w.two_term_activations = m % 2 == 0;  // two terms: 2m rows of activations
          const std::vector<float> x = Random(static_cast<size_t>(m) * k, &rng), bias = Random(n, &rng);
          std::vector<float> y[2][2];  // [engine: vector, tested][output]
          for (int e = 0; e < 2; ++e) {
            ASSERT_TRUE(SetTileEngine(e == 0 ? TileEngine::kVector : engine));
            for (auto& v : y[e]) v.assign(static_cast<size_t>(m) * n, NAN);
            const QuantOut outs[] = {{&w.w, bias.data(), y[e][0].data()}, {&w.w, nullptr, y[e][1].data()}};
            const int64_t before_products = amx::Emulated::products.load();
            LinearQuantMulti(x.data(), m, k, outs, 2);
            if (e == 1 && engine == TileEngine::kAmxEmulated) {
              const bool amx_steps = (w.w.two_term_activations ? 2 : 1) * m >= kAmxMinTokens;
              ASSERT_EQ(amx_steps, amx::Emulated::products.load() > before_products) << m << " tokens";
            }
          }
          for (int o = 0; o < 2; ++o) {
            ASSERT_EQ(0, std::memcmp(y[0][o].data(), y[1][o].data(), y[0][o].size() * sizeof(float)))
                << QuantTypeName(type) << " k " << k << " n " << n << ", " << m << " tokens, "
                << (w.w.two_term_activations ? "two terms" : "one term") << ", output " << o;
          }
        }
      }
    }
  }
  SetTileEngine(before);
}

TEST(QuantGemmTest, AmxOnEmulatedTilesGivesTheVectorBits) {
  if (!TileEngineAvailable(TileEngine::kAmxEmulated)) GTEST_SKIP() << "AMX's products need the AVX-512 build's 16-row tiles";
  ExpectVectorBits(TileEngine::kAmxEmulated);
}

// The same on the hardware's tiles, in every worker thread (each loads its own configuration).
TEST(QuantGemmTest, AmxGivesTheVectorBits) {
  if (!TileEngineAvailable(TileEngine::kAmx)) {
    GTEST_SKIP() << "no AMX here: the CPU lacks amx_tile/amx_int8, Linux refused the tile state, SPECULA_NO_AMX "
                    "is set, or the build has no 16-row tiles";
  }
  ExpectVectorBits(TileEngine::kAmx);
}

}  // namespace
}  // namespace specula::cpu

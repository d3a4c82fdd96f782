#include "kernels/cpu/packed_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <omp.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace specula::cpu {

void PackedMatrix::Free::operator()(float* p) const { std::free(p); }

PackedMatrix::PackedMatrix(const float* w, int64_t rows, int64_t cols) : row_major_(w), rows_(rows), cols_(cols) {
  const int64_t groups = (rows + kGroup - 1) / kGroup;
  const size_t bytes = static_cast<size_t>(groups * cols * kGroup) * sizeof(float);
  data_.reset(static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
  float* d = data_.get();
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < cols; ++j) {
      float* out = d + (g * cols + j) * kGroup;
      for (int64_t r = 0; r < kGroup; ++r) {
        const int64_t row = g * kGroup + r;
        out[r] = row < rows ? w[row * cols + j] : 0.0f;
      }
    }
  }
}

void PackedMatrix::Row(int64_t r, float* out) const {
  const float* g = data_.get() + (r / kGroup) * cols_ * kGroup + r % kGroup;
  for (int64_t j = 0; j < cols_; ++j) out[j] = g[j * kGroup];
}

#if defined(__AVX512F__)

bool PackedGemmAvailable() { return true; }

namespace {

constexpr int32_t kTileTokens = 6;  // 6 x 4 accumulators + 4 weight vectors + 1 broadcast <= 32 registers
constexpr int32_t kKChunk = 256;    // a group's 64 x 256 floats (64 KB) stay in L2 across token tiles

// y[MR, 64-row group] (+)= x[MR, kc] w_chunk[kc, 64]; `valid` masks the group's rows past n.
template <int MR>
void Tile(const float* w, const float* x, int64_t ldx, int32_t kc, float* y, int64_t ldy, const __mmask16* valid,
          bool accumulate) {
  __m512 acc[MR][4];
  for (int i = 0; i < MR; ++i) {
    for (int v = 0; v < 4; ++v) {
      acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(valid[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
    }
  }
  for (int32_t kk = 0; kk < kc; ++kk) {
    const float* wk = w + static_cast<int64_t>(kk) * PackedMatrix::kGroup;
    const __m512 w0 = _mm512_load_ps(wk), w1 = _mm512_load_ps(wk + 16), w2 = _mm512_load_ps(wk + 32),
                 w3 = _mm512_load_ps(wk + 48);
    for (int i = 0; i < MR; ++i) {
      const __m512 b = _mm512_set1_ps(x[i * ldx + kk]);
      acc[i][0] = _mm512_fmadd_ps(w0, b, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(w1, b, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(w2, b, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(w3, b, acc[i][3]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(y + i * ldy + 16 * v, valid[v], acc[i][v]);
  }
}

using TileFn = void (*)(const float*, const float*, int64_t, int32_t, float*, int64_t, const __mmask16*, bool);
constexpr TileFn kTiles[kTileTokens + 1] = {nullptr, Tile<1>, Tile<2>, Tile<3>, Tile<4>, Tile<5>, Tile<6>};

}  // namespace

void PackedGemm(const float* x, int32_t m, const PackedMatrix& w, const float* bias, float* y) {
  const int32_t n = static_cast<int32_t>(w.rows()), k = static_cast<int32_t>(w.cols());
  constexpr int32_t G = PackedMatrix::kGroup;
  if (m <= 0 || n <= 0) return;
  const int32_t groups = (n + G - 1) / G;
  // Work items are (block of tokens, group). Blocks of up to 96 tokens keep a group's k-chunk in L2
  // across 16 tiles; a matrix of few groups gets more, smaller blocks so that both cores stay busy.
  // Blocks are of even size, and each thread takes a contiguous run of items of equal work: with
  // shrinking blocks and a plain static split, a 32-token product over 288 rows gave one core 30
  // tokens and the other 2.
  const int32_t threads = omp_get_max_threads();
  int32_t token_blocks = (m + 16 * kTileTokens - 1) / (16 * kTileTokens);
  while (static_cast<int64_t>(groups) * token_blocks < 4 * threads && token_blocks * kTileTokens < m) ++token_blocks;
  const int32_t token_block = ((m + token_blocks - 1) / token_blocks + kTileTokens - 1) / kTileTokens * kTileTokens;
  token_blocks = (m + token_block - 1) / token_block;
  // Without reuse across token tiles (one tile), chunking k only adds accumulator traffic.
  const int32_t kchunk = m <= kTileTokens ? k : kKChunk;
  const int64_t items = static_cast<int64_t>(groups) * token_blocks;
  auto work = [&](int64_t item) {  // rows x tokens
    const int32_t g = static_cast<int32_t>(item % groups), tb = static_cast<int32_t>(item / groups);
    return static_cast<int64_t>(std::min(G, n - g * G)) * (std::min(m, (tb + 1) * token_block) - tb * token_block);
  };
  const int64_t total = static_cast<int64_t>(n) * m;
  auto run = [&](int64_t item) {
    const int32_t g = static_cast<int32_t>(item % groups), tb = static_cast<int32_t>(item / groups);
    const int32_t r0 = g * G;
    __mmask16 valid[4];
    for (int v = 0; v < 4; ++v) valid[v] = static_cast<__mmask16>((1u << std::clamp(n - r0 - 16 * v, 0, 16)) - 1);
    const float* wg = w.data() + static_cast<int64_t>(g) * k * G;
    const int32_t t_end = std::min(m, (tb + 1) * token_block);
    for (int32_t k0 = 0; k0 < k; k0 += kchunk) {
      const int32_t kc = std::min(kchunk, k - k0);
      for (int32_t t0 = tb * token_block; t0 < t_end; t0 += kTileTokens) {
        kTiles[std::min(kTileTokens, t_end - t0)](wg + static_cast<int64_t>(k0) * G, x + static_cast<int64_t>(t0) * k + k0,
                                                  k, kc, y + static_cast<int64_t>(t0) * n + r0, n, valid, k0 > 0);
      }
    }
    if (bias != nullptr) {
      for (int32_t t = tb * token_block; t < t_end; ++t) {
        for (int32_t r = r0; r < std::min(n, r0 + G); ++r) y[static_cast<int64_t>(t) * n + r] += bias[r];
      }
    }
  };
#pragma omp parallel if (static_cast<int64_t>(n) * k * m >= (1 << 14))
  {
    const int64_t me = omp_get_thread_num(), team = omp_get_num_threads();
    int64_t before = 0;  // work of the items before this one
    for (int64_t item = 0; item < items; ++item) {
      const int64_t c = work(item);
      if ((2 * before + c) * team / (2 * total) == me) run(item);  // the share holding the item's midpoint
      before += c;
    }
  }
}

#else

bool PackedGemmAvailable() { return false; }

void PackedGemm(const float* x, int32_t m, const PackedMatrix& w, const float* bias, float* y) {
  const int64_t n = w.rows(), k = w.cols();
  std::unique_ptr<float[]> row(new float[k]);
  for (int64_t r = 0; r < n; ++r) {
    w.Row(r, row.get());
    for (int32_t i = 0; i < m; ++i) {
      float t = bias != nullptr ? bias[r] : 0.0f;
      for (int64_t j = 0; j < k; ++j) t += x[i * k + j] * row[j];
      y[i * n + r] = t;
    }
  }
}

#endif

}  // namespace specula::cpu

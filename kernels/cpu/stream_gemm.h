// Float GEMM over row-major weights (float32 or int8 rows): the CPU backend's path for int8 weights,
// and for every product where the packed kernel is not compiled in (neither AVX-512 nor AVX2).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/simd.h"

namespace specula::cpu {

// Tokens per block: each weight row is read once per block and stays in L1 while the block's dot
// products use it. (OpenBLAS sgemm re-packs the whole weight matrix per call, which made a 5-row
// verification pass cost several single-token steps, and on CPUs that OpenBLAS 0.3.21 does not
// know it runs an SSE3 kernel.)
constexpr int32_t kStreamMaxRows = 8;

// A vector of weights: float as is, int8 widened (the per-row scale is applied to the dot product).
// The AVX-512 widening uses the maskz forms: GCC 12's plain ones trip -Wmaybe-uninitialized.
#if defined(__AVX512F__)
inline Vec VLoadW(const float* p) { return VLoad(p); }
inline Vec VLoadW(const int8_t* p) {
  const __m512i i32 = _mm512_maskz_cvtepi8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_maskz_cvtepi32_ps(0xFFFF, i32);
}
#elif defined(SPECULA_AVX2)
inline Vec VLoadW(const float* p) { return VLoad(p); }
inline Vec VLoadW(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#endif

// out[r][i] = w_r . x_i for R weight rows and M rows of x: each vector of a weight row is loaded
// once for all M accumulators, and each vector of x once for all R rows ((R + M) loads per R * M
// FMAs). Verification runs of a few tokens were load-bound with R = 1 and cost 2.5 single-token
// steps.
template <int M, int R, typename W>
inline __attribute__((always_inline)) void DotTile(const W* w, const float* x, int32_t k, float out[R][M]) {
#ifdef SPECULA_SIMD
  Vec acc[R][M];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) acc[r][i] = VZero();
  }
  int32_t j = 0;
  for (; j + kLanes <= k; j += kLanes) {
    Vec wv[R];
    for (int r = 0; r < R; ++r) wv[r] = VLoadW(w + static_cast<int64_t>(r) * k + j);
    for (int i = 0; i < M; ++i) {
      const Vec xv = VLoad(x + static_cast<int64_t>(i) * k + j);
      for (int r = 0; r < R; ++r) acc[r][i] = VFma(wv[r], xv, acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) {
      float t = VSum(acc[r][i]);
      for (int32_t jj = j; jj < k; ++jj) t += w[static_cast<int64_t>(r) * k + jj] * x[static_cast<int64_t>(i) * k + jj];
      out[r][i] = t;
    }
  }
#else
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) {
      float t = 0.0f;
      for (int32_t j = 0; j < k; ++j) t += w[static_cast<int64_t>(r) * k + j] * x[static_cast<int64_t>(i) * k + j];
      out[r][i] = t;
    }
  }
#endif
}

// Weight rows per tile: as many as the vector registers hold next to M accumulators each.
template <int M>
constexpr int TileRows() {
#if defined(__AVX512F__)
  return M <= 5 ? 4 : M <= 7 ? 3 : 2;  // 32 registers
#else
  return M <= 3 ? 3 : M <= 6 ? 2 : 1;  // 16 registers
#endif
}

// One product of a StreamGemm call: y[m, n] = x[m, k] w[n, k]^T * scale[n] + bias[n] (scale and
// bias may be null).
template <typename W>
struct StreamOut {
  const W* w;
  const float* scale;
  const float* bias;
  int32_t n;
  float* y;
};

// Every output of the same x[m, k], any m: each thread takes tiles of R weight rows (which stay in
// L1) and runs every block of up to MB = min(m, 8) tokens through them. Each output element is
// DotTile's sum for one (row, token), whatever the tile and block shapes around it, so a token's
// result does not depend on the batch it runs in (see packed_gemm.h).
template <int MB, typename W>
void StreamGemmBlocks(const float* x, int32_t m, int32_t k, const StreamOut<W>* outs, int32_t num_outs) {
  constexpr int R = TileRows<MB>();
  std::vector<int32_t> first_tile(num_outs + 1, 0);  // tiles of the outputs, concatenated
  int64_t work = 0;
  for (int32_t o = 0; o < num_outs; ++o) {
    first_tile[o + 1] = first_tile[o] + (outs[o].n + R - 1) / R;
    work += static_cast<int64_t>(outs[o].n) * k * m;
  }
#pragma omp parallel for schedule(static) if (work >= (1 << 11))
  for (int32_t t = 0; t < first_tile[num_outs]; ++t) {
    int32_t o = 0;
    while (t >= first_tile[o + 1]) ++o;
    const StreamOut<W>& out = outs[o];
    const int32_t r0 = (t - first_tile[o]) * R, rows = std::min(R, out.n - r0);
    const W* w = out.w + static_cast<int64_t>(r0) * k;
    for (int32_t i0 = 0; i0 < m; i0 += MB) {
      const int32_t mb = std::min(MB, m - i0);
      const float* xb = x + static_cast<int64_t>(i0) * k;
      float tile[R][MB] = {};  // (zeroed: GCC 12 cannot see that a partial tile reads only what it wrote)
      if (mb == MB && rows == R) {
        DotTile<MB, R>(w, xb, k, tile);
      } else {  // the edges: one (row, token) at a time, the same sums
        for (int32_t r = 0; r < rows; ++r) {
          for (int32_t i = 0; i < mb; ++i) {
            float one[1][1];
            DotTile<1, 1>(w + static_cast<int64_t>(r) * k, xb + static_cast<int64_t>(i) * k, k, one);
            tile[r][i] = one[0][0];
          }
        }
      }
      for (int32_t r = 0; r < rows; ++r) {
        const float a = out.scale != nullptr ? out.scale[r0 + r] : 1.0f, b = out.bias != nullptr ? out.bias[r0 + r] : 0.0f;
        for (int32_t i = 0; i < mb; ++i) out.y[static_cast<int64_t>(i0 + i) * out.n + r0 + r] = tile[r][i] * a + b;
      }
    }
  }
}

template <typename W>
void StreamGemm(const float* x, int32_t m, int32_t k, const StreamOut<W>* outs, int32_t num_outs) {
  switch (std::min(m, kStreamMaxRows)) {
    case 1: return StreamGemmBlocks<1>(x, m, k, outs, num_outs);
    case 2: return StreamGemmBlocks<2>(x, m, k, outs, num_outs);
    case 3: return StreamGemmBlocks<3>(x, m, k, outs, num_outs);
    case 4: return StreamGemmBlocks<4>(x, m, k, outs, num_outs);
    case 5: return StreamGemmBlocks<5>(x, m, k, outs, num_outs);
    case 6: return StreamGemmBlocks<6>(x, m, k, outs, num_outs);
    case 7: return StreamGemmBlocks<7>(x, m, k, outs, num_outs);
    case 8: return StreamGemmBlocks<8>(x, m, k, outs, num_outs);
    default: return;
  }
}

// One output: y[m, n] = x[m, k] w[n, k]^T * scale[n] + bias[n].
template <typename W>
void StreamGemm(const float* x, int32_t m, int32_t k, const W* w, const float* scale, int32_t n, float* y,
                const float* bias) {
  const StreamOut<W> out{w, scale, bias, n, y};
  StreamGemm(x, m, k, &out, 1);
}

}  // namespace specula::cpu

// Small-m float GEMM over row-major weights (float32 or int8 rows), the CPU backend's path for
// up to kStreamMaxRows tokens through matrices too small to split evenly in packed groups.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/simd.h"

namespace specula::cpu {

// y[m, n] = x[m, k] w[n, k]^T for a handful of rows (speculative verification, small decode
// batches). Still memory-bound: each weight row is read once and stays in L1 while the m dot
// products use it. OpenBLAS sgemm re-packs the whole weight matrix per call, which made a 5-row
// verification pass cost several single-token steps.
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

// y[m, n] (row stride ldy) = x[m, k] w[n, k]^T * scale[n] + bias[n], for m <= 8; scale and bias
// may be null.
template <int M, typename W>
void StreamGemmM(const float* x, int32_t k, const W* w, const float* scale, int32_t n, float* y, int64_t ldy,
                 const float* bias) {
  constexpr int R = TileRows<M>();
  const int32_t tiles = (n + R - 1) / R;
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(n) * k >= (1 << 11))
  for (int32_t t = 0; t < tiles; ++t) {
    const int32_t r0 = t * R;
    float out[R][M] = {};  // (zeroed: GCC 12 cannot see that a partial tile reads only what it wrote)
    if (r0 + R <= n) {
      DotTile<M, R>(w + static_cast<int64_t>(r0) * k, x, k, out);
    } else {
      for (int32_t r = r0; r < n; ++r) DotTile<M, 1>(w + static_cast<int64_t>(r) * k, x, k, reinterpret_cast<float(*)[M]>(out[r - r0]));
    }
    for (int32_t r = r0; r < std::min(n, r0 + R); ++r) {
      const float a = scale != nullptr ? scale[r] : 1.0f, b = bias != nullptr ? bias[r] : 0.0f;
      for (int i = 0; i < M; ++i) y[static_cast<int64_t>(i) * ldy + r] = out[r - r0][i] * a + b;
    }
  }
}

template <typename W>
void StreamGemm(const float* x, int32_t m, int32_t k, const W* w, const float* scale, int32_t n, float* y,
                int64_t ldy, const float* bias) {
  switch (m) {
    case 1: return StreamGemmM<1>(x, k, w, scale, n, y, ldy, bias);
    case 2: return StreamGemmM<2>(x, k, w, scale, n, y, ldy, bias);
    case 3: return StreamGemmM<3>(x, k, w, scale, n, y, ldy, bias);
    case 4: return StreamGemmM<4>(x, k, w, scale, n, y, ldy, bias);
    case 5: return StreamGemmM<5>(x, k, w, scale, n, y, ldy, bias);
    case 6: return StreamGemmM<6>(x, k, w, scale, n, y, ldy, bias);
    case 7: return StreamGemmM<7>(x, k, w, scale, n, y, ldy, bias);
    default: return StreamGemmM<8>(x, k, w, scale, n, y, ldy, bias);
  }
}

}  // namespace specula::cpu

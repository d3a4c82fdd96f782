// Sampling an index from a categorical distribution, and the greedy index, shared by the sampler,
// the proposers, the verifier and the CPU backend.
#pragma once

#include <cmath>
#include <cstddef>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "absl/types/span.h"
#include "core/batch.h"

namespace specula {

// Samples an index from non-negative `weights` (not necessarily normalized) with u in [0, 1).
// Zero-weight entries are never returned.
inline TokenId SampleCategorical(absl::Span<const float> weights, double u) {
  const float* w = weights.data();  // not weights[i]: see Argmax
  const size_t n = weights.size();
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += w[i];
  const double target = u * total;
  double cdf = 0.0;
  TokenId last = 0;
  for (size_t i = 0; i < n; ++i) {
    if (w[i] <= 0.0f) continue;
    cdf += w[i];
    last = static_cast<TokenId>(i);
    if (target < cdf) return last;
  }
  return last;  // rounding: u landed past the accumulated mass
}

// The first index of the largest value, NaNs ignored (0 when there is none): the greedy token of
// the engine's sampler, its greedy distribution and the CPU backend's Sample op, so that they all
// agree. Two passes: running maxima a vector wide, then a vector's compares at a time for the first
// block holding the maximum. With intrinsics: GCC 12 kept the plain 16-lane loops scalar (and a
// Span's operator[] is bounds-checked in hardened Abseil builds, Debian's): 22-25 us per
// 32000-token row, 2.7% of a 32-sequence batched run's samples.
inline TokenId Argmax(absl::Span<const float> logits) {
  const float* p = logits.data();
  const size_t n = logits.size();
  size_t i = 0;
  float mx = -INFINITY;
#if defined(__AVX512F__)
  constexpr size_t kW = 16;
  if (n >= kW) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    // A NaN keeps m. (maskz: the plain form trips GCC 12's -Wmaybe-uninitialized.)
    for (; i + kW <= n; i += kW) m = _mm512_maskz_max_ps(0xFFFF, _mm512_loadu_ps(p + i), m);
    float lanes[kW];  // not _mm512_reduce_max_ps: GCC 12 warns (-Wmaybe-uninitialized) inside it
    _mm512_storeu_ps(lanes, m);
    for (float v : lanes) mx = v > mx ? v : mx;
  }
#elif defined(__AVX2__)
  constexpr size_t kW = 8;
  if (n >= kW) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (; i + kW <= n; i += kW) m = _mm256_max_ps(_mm256_loadu_ps(p + i), m);  // a NaN keeps m
    float lanes[kW];
    _mm256_storeu_ps(lanes, m);
    for (float v : lanes) mx = v > mx ? v : mx;
  }
#endif
  for (; i < n; ++i) mx = p[i] > mx ? p[i] : mx;
  i = 0;
#if defined(__AVX512F__)
  for (const __m512 mv = _mm512_set1_ps(mx); i + kW <= n; i += kW) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(p + i), mv, _CMP_EQ_OQ);
    if (eq != 0) return static_cast<TokenId>(i + __builtin_ctz(eq));
  }
#elif defined(__AVX2__)
  for (const __m256 mv = _mm256_set1_ps(mx); i + kW <= n; i += kW) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + i), mv, _CMP_EQ_OQ));
    if (eq != 0) return static_cast<TokenId>(i + __builtin_ctz(eq));
  }
#endif
  for (; i < n; ++i) {
    if (p[i] == mx) return static_cast<TokenId>(i);
  }
  return 0;
}

}  // namespace specula

// Vector helpers of the CPU backend. AVX2+FMA where the compiler targets it (-march=native on the
// x86 machines we run on), portable loops otherwise. No -ffast-math: these are written so that the
// compiler vectorizes them without it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPECULA_AVX2 1
#endif

namespace specula::cpu {

// exp(x) for x in [-87, 88] with relative error ~2e-7, branch-free so that `omp simd` loops
// vectorize it (libm's expf does not vectorize without -ffast-math): 2^(x log2 e) split into an
// integer power, built in the exponent bits, and e^f for |f| <= ln2/2 by its Taylor series.
#pragma omp declare simd
inline float ExpApprox(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float t = x * 1.4426950409f;
  const float n = std::nearbyint(t);
  const float f = (t - n) * 0.6931471806f;
  float p = 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

#ifdef SPECULA_AVX2
inline __attribute__((always_inline)) float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Four accumulators along k hide the FMA latency; rows stay one sequential stream, which the
// hardware prefetcher follows best (measured: interleaving 4 rows halves the bandwidth here).
inline __attribute__((always_inline)) float Dot(const float* a, const float* b, int32_t k) {
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
  int32_t j = 0;
  for (; j + 32 <= k; j += 32) {
    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), c0);
    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), c1);
    c2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 16), _mm256_loadu_ps(b + j + 16), c2);
    c3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 24), _mm256_loadu_ps(b + j + 24), c3);
  }
  for (; j + 8 <= k; j += 8) c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), c0);
  float t = HorizontalSum(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
  for (; j < k; ++j) t += a[j] * b[j];
  return t;
}
#else
inline float Dot(const float* a, const float* b, int32_t k) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int32_t j = 0; j < k; ++j) acc += a[j] * b[j];
  return acc;
}
#endif

// oh[hd] = sum_p weight[p] * V[p] for p in [0, ctx), reading V rows through a block table
// (`v` points at the head's first element; rows are `row` floats apart).
inline void WeightedSum(const float* weight, int32_t ctx, const float* v, const int32_t* table, int32_t bs,
                        int64_t row, int32_t hd, float* oh) {
  std::fill(oh, oh + hd, 0.0f);
  for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
    const float* vb = v + static_cast<int64_t>(table[p0 / bs]) * bs * row;
    const int32_t n = std::min(bs, ctx - p0);
    for (int32_t j = 0; j < n; ++j) {
      const float* vp = vb + j * row;
      const float w = weight[p0 + j];
#pragma omp simd
      for (int32_t i = 0; i < hd; ++i) oh[i] += w * vp[i];
    }
  }
}

// The same with hd = 8 * NV, its accumulators held in registers.
template <int NV>
void WeightedSumRegs(const float* weight, int32_t ctx, const float* v, const int32_t* table, int32_t bs,
                     int64_t row, float* oh) {
#ifdef SPECULA_AVX2
  __m256 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm256_setzero_ps();
  for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
    const float* vb = v + static_cast<int64_t>(table[p0 / bs]) * bs * row;
    const int32_t n = std::min(bs, ctx - p0);
    for (int32_t j = 0; j < n; ++j) {
      const float* vp = vb + j * row;
      const __m256 w = _mm256_set1_ps(weight[p0 + j]);
      for (int i = 0; i < NV; ++i) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(vp + 8 * i), w, acc[i]);
    }
  }
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(oh + 8 * i, acc[i]);
#else
  WeightedSum(weight, ctx, v, table, bs, row, 8 * NV, oh);
#endif
}


#if defined(__AVX512F__)
// Sum of each of 16 vectors, as one vector (lane i = sum of a[i]): a transpose-and-add tree of
// 30 shuffles and 15 adds instead of 16 separate horizontal sums. Written with
// __builtin_shufflevector because GCC 12's unpack intrinsics trip -Wmaybe-uninitialized (bug 105593).
inline __attribute__((always_inline)) __m512 Sum16(const __m512 a[16]) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] of x = a[2i], y = a[2i+1]
    const __m512 x = a[2 * i], y = a[2 * i + 1];
    b[i] = __builtin_shufflevector(x, y, 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29) +
           __builtin_shufflevector(x, y, 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
  }
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: that lane's sums of a[4i .. 4i+3]
    const __m512 x = b[2 * i], y = b[2 * i + 1];
    c[i] = __builtin_shufflevector(x, y, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           __builtin_shufflevector(x, y, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  }
  // Across the four 128-bit lanes: even lanes plus odd lanes, twice.
  const __m512 e0 = __builtin_shufflevector(c[0], c[1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                    __builtin_shufflevector(c[0], c[1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const __m512 e1 = __builtin_shufflevector(c[2], c[3], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                    __builtin_shufflevector(c[2], c[3], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  return __builtin_shufflevector(e0, e1, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
         __builtin_shufflevector(e0, e1, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}

// sc[j] = scale * q . k_j for the n <= 16 key rows k_j = k + j * row, with hd = 16 * NV. The query
// stays in registers; a decode step attends with one query to hundreds of keys.
template <int NV>
inline void ScoreKeys16(const __m512 q[NV], const float* k, int64_t row, int32_t n, float scale, float* sc) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) {
    acc[j] = _mm512_setzero_ps();
    if (j < n) {
      const float* kj = k + j * row;
      for (int i = 0; i < NV; ++i) acc[j] = _mm512_fmadd_ps(q[i], _mm512_loadu_ps(kj + 16 * i), acc[j]);
    }
  }
  const __m512 s = _mm512_mul_ps(Sum16(acc), _mm512_set1_ps(scale));
  _mm512_mask_storeu_ps(sc, static_cast<__mmask16>((1u << n) - 1), s);
}

// Attention of one query head over ctx positions of a paged KV head (hd = 16 * NV): scores into
// sc[ctx], then softmax(sc) (by `softmax`), then oh[hd] = sum_p sc[p] V[p].
template <int NV>
void ScoreKeys(const float* qh, const float* k, const int32_t* table, int32_t bs, int64_t row, int32_t ctx,
               float scale, float* sc) {
  __m512 q[NV];
  for (int i = 0; i < NV; ++i) q[i] = _mm512_loadu_ps(qh + 16 * i);
  for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
    const float* kb = k + static_cast<int64_t>(table[p0 / bs]) * bs * row;
    const int32_t n = std::min(bs, ctx - p0);
    for (int32_t j = 0; j < n; j += 16) ScoreKeys16<NV>(q, kb + j * row, row, std::min(16, n - j), scale, sc + p0 + j);
  }
}

template <int NV>
void WeightedSum512(const float* weight, int32_t ctx, const float* v, const int32_t* table, int32_t bs, int64_t row,
                    float* oh) {
  __m512 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm512_setzero_ps();
  for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
    const float* vb = v + static_cast<int64_t>(table[p0 / bs]) * bs * row;
    const int32_t n = std::min(bs, ctx - p0);
    for (int32_t j = 0; j < n; ++j) {
      const __m512 w = _mm512_set1_ps(weight[p0 + j]);
      for (int i = 0; i < NV; ++i) acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(vb + j * row + 16 * i), w, acc[i]);
    }
  }
  for (int i = 0; i < NV; ++i) _mm512_storeu_ps(oh + 16 * i, acc[i]);
}

// All heads of one token over ctx positions, a block at a time: every head's keys of a block before
// the next block, so that the token reads its K and V as sequential streams (one head at a time
// strides through the pool and ran at half the bandwidth in 32-sequence decode steps).
// q[heads, hd] and out[heads, hd] with hd = 16 * NV; k and v point at the pool; sc is [heads, ctx].
template <int NV>
void AttendAllHeads(const float* q, const float* k, const float* v, const int32_t* table, int32_t bs, int64_t row,
                    int32_t ctx, int32_t heads, int32_t group, float scale, float* sc, float* out,
                    void (*softmax)(float*, int32_t, int32_t)) {
  constexpr int32_t hd = 16 * NV;
  for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
    const float* kb = k + static_cast<int64_t>(table[p0 / bs]) * bs * row;
    const int32_t n = std::min(bs, ctx - p0);
    for (int32_t h = 0; h < heads; ++h) {
      __m512 qh[NV];
      for (int i = 0; i < NV; ++i) qh[i] = _mm512_loadu_ps(q + h * hd + 16 * i);
      const float* kh = kb + (h / group) * hd;
      for (int32_t j = 0; j < n; j += 16) {
        ScoreKeys16<NV>(qh, kh + j * row, row, std::min(16, n - j), scale, sc + static_cast<int64_t>(h) * ctx + p0 + j);
      }
    }
  }
  for (int32_t h = 0; h < heads; ++h) softmax(sc + static_cast<int64_t>(h) * ctx, ctx, ctx);
  for (int32_t i = 0; i < heads * hd; ++i) out[i] = 0.0f;
  for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
    const float* vb = v + static_cast<int64_t>(table[p0 / bs]) * bs * row;
    const int32_t n = std::min(bs, ctx - p0);
    for (int32_t h = 0; h < heads; ++h) {
      __m512 acc[NV];
      for (int i = 0; i < NV; ++i) acc[i] = _mm512_loadu_ps(out + h * hd + 16 * i);
      const float* vh = vb + (h / group) * hd;
      const float* w = sc + static_cast<int64_t>(h) * ctx + p0;
      for (int32_t j = 0; j < n; ++j) {
        const __m512 wj = _mm512_set1_ps(w[j]);
        for (int i = 0; i < NV; ++i) acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(vh + j * row + 16 * i), wj, acc[i]);
      }
      for (int i = 0; i < NV; ++i) _mm512_storeu_ps(out + h * hd + 16 * i, acc[i]);
    }
  }
}
#endif  // __AVX512F__

}  // namespace specula::cpu

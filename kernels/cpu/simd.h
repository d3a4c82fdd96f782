// Vector helpers of the CPU backend: one small vector layer (`Vec`, kLanes floats: 16 with AVX-512,
// 8 with AVX2+FMA) that the GEMM tiles and the attention kernels are written against once, plus
// bf16 conversions. Portable loops where neither is compiled in. No -ffast-math: these are written
// so that the compiler vectorizes them without it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPECULA_AVX2 1
#endif
#if defined(__AVX512F__) || defined(SPECULA_AVX2)
#define SPECULA_SIMD 1
#endif

namespace specula::cpu {

// A bfloat16 element (KV storage with --kv-cache-dtype bf16): the top 16 bits of a float32.
struct Bf16 {
  uint16_t bits;
};

inline float ToF32(float x) { return x; }
inline float ToF32(Bf16 x) {
  const uint32_t b = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}
// Round to nearest even; NaN stays NaN (quiet). Branch-free so that loops over rows vectorize.
inline Bf16 ToBf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  const bool nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
  return Bf16{static_cast<uint16_t>(nan ? ((b >> 16) | 0x40u) : rounded)};
}

// exp(x) for x in [-87, 88] with relative error ~2e-7, branch-free so that `omp simd` loops
// vectorize it (libm's expf does not vectorize without -ffast-math): 2^(x log2 e) split into an
// integer power, built in the exponent bits, and e^f for |f| <= ln2/2 by its Taylor series.
#ifdef _OPENMP
#pragma omp declare simd
#endif
inline float ExpApprox(float x) {
  // The clamp's operand order also turns NaN into 88: converting NaN to int below is undefined
  // (UBSan stopped a TP follower on the NaN scores of the cost model's timing forwards).
  x = std::max(-87.0f, std::min(88.0f, x));
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

// --- The vector layer ----------------------------------------------------------------------------
// Simd8 (AVX2: 8 floats) and, with AVX-512, Simd16: the same operations at two widths, so that a
// kernel written once can take the widest vector a shape fills (a head of 8 floats takes Simd8 on
// AVX-512 machines too).
#ifdef SPECULA_AVX2
struct Simd8 {
  using V = __m256;
  static constexpr int32_t kLanes = 8;
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  // bf16 -> f32 in registers: widen to 32 bits and shift into the high half (exact).
  static V Load(const Bf16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // 2 x 8 bf16 -> f32 without the widening shuffle: `even` gets the even-indexed elements (the low
  // halves of the 32-bit pairs, shifted up) and `odd` the odd-indexed ones (the high halves, masked).
  // Exact, and one integer operation per vector instead of two.
  static void LoadSplit(const Bf16* p, V& even, V& odd) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
  }
  // 2 x 8 floats into LoadSplit's order and back.
  static void Deinterleave(const float* p, V& even, V& odd) {
    const V a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
    even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
  }
  static void Interleave(V even, V odd, float* p) {
    const V lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
    _mm256_storeu_ps(p, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  // ExpLanes' (below) width-specific steps: min with NaN -> b, round to nearest, and 2^n built in
  // the exponent bits from an integer-valued n.
  static V Min(V a, V b) { return _mm256_min_ps(a, b); }
  static V Round(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V Pow2(V n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static float MaxLanes(V v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
  }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void StoreFirst(float* p, V v, int32_t n) {  // the first n lanes only
    if (n == 8) return _mm256_storeu_ps(p, v);  // the common case: a copy through the stack cost 5% of attention
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    std::copy(t, t + n, p);
  }
  static float Sum(V v) { return HorizontalSum(v); }
  // Lane i of the result is the sum of a[i]: three rounds of horizontal adds, then the two 128-bit
  // halves (7 instructions for 8 sums instead of 8 horizontal sums of 4 each).
  static __attribute__((always_inline)) V SumLanes(const V a[8]) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
  }
};
#endif

#if defined(__AVX512F__)
struct Simd16 {
  using V = __m512;
  static constexpr int32_t kLanes = 16;
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static V Load(const Bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    // The maskz forms: GCC 12's plain ones trip -Wmaybe-uninitialized (bug 105593).
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
  }
  static void LoadSplit(const Bf16* p, V& even, V& odd) {  // as Simd8's, 2 x 16 elements
    const __m512i x = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, x, 16));
    odd = _mm512_castsi512_ps(_mm512_maskz_and_epi32(0xFFFF, x, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
  }
  static void Deinterleave(const float* p, V& even, V& odd) {  // as Simd8's, 2 x 16 floats
    const V a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
    even = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    odd = __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  }
  static void Interleave(V even, V odd, float* p) {
    _mm512_storeu_ps(p, __builtin_shufflevector(even, odd, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23));
    _mm512_storeu_ps(p + 16,
                     __builtin_shufflevector(even, odd, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
  }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  // The maskz forms below, as in Load: GCC 12's plain ones trip -Wmaybe-uninitialized (bug 105593).
  static V Max(V a, V b) { return _mm512_maskz_max_ps(0xFFFF, a, b); }
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Min(V a, V b) { return _mm512_maskz_min_ps(0xFFFF, a, b); }
  static V Round(V x) { return _mm512_maskz_roundscale_ps(0xFFFF, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V Pow2(V n) {
    const __m512i e = _mm512_add_epi32(_mm512_maskz_cvttps_epi32(0xFFFF, n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, e, 23));
  }
  static float MaxLanes(V v) {  // once per row, as Sum
    alignas(64) float t[16];
    _mm512_store_ps(t, v);
    return Simd8::MaxLanes(_mm256_max_ps(_mm256_load_ps(t), _mm256_load_ps(t + 8)));
  }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void StoreFirst(float* p, V v, int32_t n) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
  }
  static float Sum(V v) {  // once per output: a store is as fast as shuffles here
    alignas(64) float t[16];
    _mm512_store_ps(t, v);
    return HorizontalSum(_mm256_add_ps(_mm256_load_ps(t), _mm256_load_ps(t + 8)));
  }
  // Lane i of the result is the sum of a[i]: a transpose-and-add tree of 30 shuffles and 15 adds
  // instead of 16 separate horizontal sums. Written with __builtin_shufflevector because GCC 12's
  // unpack intrinsics trip -Wmaybe-uninitialized (bug 105593).
  static __attribute__((always_inline)) V SumLanes(const V a[16]) {
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
};
using SimdWide = Simd16;
#elif defined(SPECULA_AVX2)
using SimdWide = Simd8;
#endif

#ifdef SPECULA_SIMD
// ExpApprox lane by lane, at either width: the same operations in the same order, so the same bits
// (a scalar tail and the vector lanes agree).
template <typename S>
__attribute__((always_inline)) inline typename S::V ExpLanes(typename S::V x) {
  using V = typename S::V;
  x = S::Max(S::Min(x, S::Set1(88.0f)), S::Set1(-87.0f));  // NaN -> 88, as ExpApprox
  const V t = S::Mul(x, S::Set1(1.4426950409f));
  const V n = S::Round(t);
  const V f = S::Mul(S::Sub(t, n), S::Set1(0.6931471806f));
  V p = S::Fma(S::Set1(1.0f / 720.0f), f, S::Set1(1.0f / 120.0f));
  p = S::Fma(p, f, S::Set1(1.0f / 24.0f));
  p = S::Fma(p, f, S::Set1(1.0f / 6.0f));
  p = S::Fma(p, f, S::Set1(0.5f));
  p = S::Fma(p, f, S::Set1(1.0f));
  p = S::Fma(p, f, S::Set1(1.0f));
  return S::Mul(p, S::Pow2(n));
}

// The widest vector, under short names (the GEMM tiles).
using Vec = SimdWide::V;
constexpr int32_t kLanes = SimdWide::kLanes;
inline Vec VLoad(const float* p) { return SimdWide::Load(p); }
inline Vec VFma(Vec a, Vec b, Vec c) { return SimdWide::Fma(a, b, c); }
inline Vec VZero() { return SimdWide::Zero(); }
inline float VSum(Vec v) { return SimdWide::Sum(v); }
#endif

}  // namespace specula::cpu

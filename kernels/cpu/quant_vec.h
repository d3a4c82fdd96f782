// The vector layer of the quantized products (kernels/cpu/quant_units.cc, tile_gemm.cc): integer and
// float vectors of 512 bits (AVX-512 BW, with VNNI where present) or 256 (AVX2), and the shuffles the
// kernels need, one set of names for both widths. Included by .cc files only: everything has internal
// linkage, so the AVX2 and AVX-512 builds of those files never share a definition.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/simd.h"

namespace specula::cpu {
namespace {  // NOLINT(build/namespaces): internal to each includer, see above

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define SPECULA_QUANT_WIDTH 512
#elif defined(SPECULA_AVX2) && defined(__F16C__)
#define SPECULA_QUANT_WIDTH 256
#endif

#if defined(SPECULA_QUANT_WIDTH)
#if defined(__AVX512VNNI__) && SPECULA_QUANT_WIDTH == 512
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

#if SPECULA_QUANT_WIDTH == 512
using IVec = __m512i;
using FVec = __m512;
constexpr int kV = 4;  // 128-bit lanes per vector
inline IVec LoadI(const void* p) { return _mm512_loadu_si512(p); }
inline void StoreI(void* p, IVec v) { _mm512_storeu_si512(p, v); }
inline IVec ZeroI() { return _mm512_setzero_si512(); }
inline IVec Bytes(char b) { return _mm512_set1_epi8(b); }
inline IVec And(IVec a, IVec b) { return _mm512_and_si512(a, b); }
inline IVec Or(IVec a, IVec b) { return _mm512_or_si512(a, b); }
inline IVec Xor(IVec a, IVec b) { return _mm512_xor_si512(a, b); }
inline IVec Shr4(IVec v) { return _mm512_maskz_srli_epi16(0xFFFFFFFF, v, 4); }  // then masked: nibbles of each byte
inline IVec Sub32(IVec a, IVec b) { return _mm512_sub_epi32(a, b); }
inline IVec Add32(IVec a, IVec b) { return _mm512_add_epi32(a, b); }
inline IVec Lo32(IVec a, IVec b) { return _mm512_maskz_unpacklo_epi32(0xFFFF, a, b); }
inline IVec Hi32(IVec a, IVec b) { return _mm512_maskz_unpackhi_epi32(0xFFFF, a, b); }
inline IVec SwapHalves(IVec v) { return _mm512_maskz_shuffle_epi32(0xFFFF, v, _MM_PERM_BADC); }  // dwords 2 3 0 1
inline IVec SwapPairs(IVec v) { return _mm512_maskz_shuffle_epi32(0xFFFF, v, _MM_PERM_CDAB); }   // dwords 1 0 3 2
// In each 128-bit lane, dword s of a[j] <-> dword j of a[s] (a 4 x 4 transpose per lane).
inline void Transpose4(IVec a[4]) {
  const IVec t0 = Lo32(a[0], a[1]), t1 = Hi32(a[0], a[1]), t2 = Lo32(a[2], a[3]), t3 = Hi32(a[2], a[3]);
  a[0] = _mm512_maskz_unpacklo_epi64(0xFF, t0, t2);
  a[1] = _mm512_maskz_unpackhi_epi64(0xFF, t0, t2);
  a[2] = _mm512_maskz_unpacklo_epi64(0xFF, t1, t3);
  a[3] = _mm512_maskz_unpackhi_epi64(0xFF, t1, t3);
}
inline IVec Abs8(IVec v) { return _mm512_abs_epi8(v); }
// x negated where w < 0 (vpsignb has no 512-bit form; where w == 0, |w| = 0 cancels x anyway).
inline IVec Sign8(IVec x, IVec w) { return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), ZeroI(), x); }
inline IVec Maddubs(IVec u, IVec x) { return _mm512_maddubs_epi16(u, x); }
inline IVec Add16(IVec a, IVec b) { return _mm512_add_epi16(a, b); }
inline IVec Madd1(IVec v, IVec acc) { return _mm512_add_epi32(acc, _mm512_madd_epi16(v, _mm512_set1_epi16(1))); }
inline FVec ToF(IVec v) { return _mm512_maskz_cvtepi32_ps(0xFFFF, v); }
inline FVec LoadF(const float* p) { return _mm512_loadu_ps(p); }
inline FVec ZeroF() { return _mm512_setzero_ps(); }
inline FVec SetF(float a) { return _mm512_set1_ps(a); }
inline FVec MulF(FVec a, FVec b) { return _mm512_mul_ps(a, b); }
inline FVec FmaF(FVec a, FVec b, FVec c) { return _mm512_fmadd_ps(a, b, c); }
using SimdQ = Simd16;  // SumLanes, StoreFirst
// Lane 4t + s of a unit's group vectors holds group kV s + t (lane t of weight vector s). The K
// types' scale bytes come in group order: this byte shuffle puts them in lane order.
inline __m128i LaneOrder() { return _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15); }
inline FVec BytesToF(__m128i b) { return ToF(_mm512_maskz_cvtepu8_epi32(0xFFFF, b)); }
inline FVec SBytesToF(__m128i b) { return ToF(_mm512_maskz_cvtepi8_epi32(0xFFFF, b)); }
// Q4_K: lanes of the unit's first superblock (vectors 0 and 1) take a0, of the second a1.
inline FVec PerSuper(float a0, float a1) { return _mm512_mask_blend_ps(0xCCCC, SetF(a0), SetF(a1)); }
// 4 int32 accumulators with 4 partial sums of group (s, t) in lane t of a[s] -> lane 4t + s. (The
// AVX-512 intrinsics in their maskz forms here and below: GCC 12's plain ones trip
// -Wmaybe-uninitialized, bug 105593.)
inline IVec Reduce(const IVec a[4]) {
  const __m512 r01 = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_maskz_unpacklo_epi64(0xFF, a[0], a[1]),
                                                          _mm512_maskz_unpackhi_epi64(0xFF, a[0], a[1])));
  const __m512 r23 = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_maskz_unpacklo_epi64(0xFF, a[2], a[3]),
                                                          _mm512_maskz_unpackhi_epi64(0xFF, a[2], a[3])));
  return _mm512_add_epi32(_mm512_castps_si512(_mm512_maskz_shuffle_ps(0xFFFF, r01, r23, _MM_SHUFFLE(2, 0, 2, 0))),
                          _mm512_castps_si512(_mm512_maskz_shuffle_ps(0xFFFF, r01, r23, _MM_SHUFFLE(3, 1, 3, 1))));
}
// [lo, hi] (a shuffle: the insert intrinsics are among GCC 12's warning ones).
inline IVec Concat(__m256i lo, __m256i hi) {
  const __v4di l = reinterpret_cast<__v4di>(lo), h = reinterpret_cast<__v4di>(hi);
  return reinterpret_cast<IVec>(__builtin_shufflevector(l, h, 0, 1, 2, 3, 4, 5, 6, 7));
}
// Lane t of the result: 16 bytes at p + t * stride (zero for t >= valid unless kFull).
template <bool kFull>
inline IVec LoadLanes(const uint8_t* p, int64_t stride, int valid) {
  __m128i l[4];
  for (int t = 0; t < 4; ++t) {
    l[t] = kFull || t < valid ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + t * stride)) : _mm_setzero_si128();
  }
  return Concat(_mm256_set_m128i(l[1], l[0]), _mm256_set_m128i(l[3], l[2]));
}
#else  // 256
using IVec = __m256i;
using FVec = __m256;
constexpr int kV = 2;
inline IVec LoadI(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void StoreI(void* p, IVec v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
inline IVec ZeroI() { return _mm256_setzero_si256(); }
inline IVec Bytes(char b) { return _mm256_set1_epi8(b); }
inline IVec And(IVec a, IVec b) { return _mm256_and_si256(a, b); }
inline IVec Or(IVec a, IVec b) { return _mm256_or_si256(a, b); }
inline IVec Xor(IVec a, IVec b) { return _mm256_xor_si256(a, b); }
inline IVec Shr4(IVec v) { return _mm256_srli_epi16(v, 4); }
inline IVec Sub32(IVec a, IVec b) { return _mm256_sub_epi32(a, b); }
inline IVec Add32(IVec a, IVec b) { return _mm256_add_epi32(a, b); }
inline IVec Lo32(IVec a, IVec b) { return _mm256_unpacklo_epi32(a, b); }
inline IVec Hi32(IVec a, IVec b) { return _mm256_unpackhi_epi32(a, b); }
inline IVec SwapHalves(IVec v) { return _mm256_shuffle_epi32(v, 0x4E); }
inline IVec SwapPairs(IVec v) { return _mm256_shuffle_epi32(v, 0xB1); }
inline void Transpose4(IVec a[4]) {
  const IVec t0 = Lo32(a[0], a[1]), t1 = Hi32(a[0], a[1]), t2 = Lo32(a[2], a[3]), t3 = Hi32(a[2], a[3]);
  a[0] = _mm256_unpacklo_epi64(t0, t2);
  a[1] = _mm256_unpackhi_epi64(t0, t2);
  a[2] = _mm256_unpacklo_epi64(t1, t3);
  a[3] = _mm256_unpackhi_epi64(t1, t3);
}
inline IVec Abs8(IVec v) { return _mm256_abs_epi8(v); }
inline IVec Sign8(IVec x, IVec w) { return _mm256_sign_epi8(x, w); }
inline IVec Maddubs(IVec u, IVec x) { return _mm256_maddubs_epi16(u, x); }
inline IVec Add16(IVec a, IVec b) { return _mm256_add_epi16(a, b); }
inline IVec Madd1(IVec v, IVec acc) { return _mm256_add_epi32(acc, _mm256_madd_epi16(v, _mm256_set1_epi16(1))); }
inline FVec ToF(IVec v) { return _mm256_cvtepi32_ps(v); }
inline FVec LoadF(const float* p) { return _mm256_loadu_ps(p); }
inline FVec ZeroF() { return _mm256_setzero_ps(); }
inline FVec SetF(float a) { return _mm256_set1_ps(a); }
inline FVec MulF(FVec a, FVec b) { return _mm256_mul_ps(a, b); }
inline FVec FmaF(FVec a, FVec b, FVec c) { return _mm256_fmadd_ps(a, b, c); }
using SimdQ = Simd8;
inline __m128i LaneOrder() { return _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, -1, -1, -1, -1, -1, -1, -1, -1); }
inline FVec BytesToF(__m128i b) { return ToF(_mm256_cvtepu8_epi32(b)); }
inline FVec SBytesToF(__m128i b) { return ToF(_mm256_cvtepi8_epi32(b)); }
inline FVec PerSuper(float a0, float) { return SetF(a0); }
inline IVec Reduce(const IVec a[4]) {
  const __m256 r01 = _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_unpacklo_epi64(a[0], a[1]), _mm256_unpackhi_epi64(a[0], a[1])));
  const __m256 r23 = _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_unpacklo_epi64(a[2], a[3]), _mm256_unpackhi_epi64(a[2], a[3])));
  return _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(r01, r23, _MM_SHUFFLE(2, 0, 2, 0))),
                          _mm256_castps_si256(_mm256_shuffle_ps(r01, r23, _MM_SHUFFLE(3, 1, 3, 1))));
}
template <bool kFull>
inline IVec LoadLanes(const uint8_t* p, int64_t stride, int valid) {
  __m128i l[2];
  for (int t = 0; t < 2; ++t) {
    l[t] = kFull || t < valid ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + t * stride)) : _mm_setzero_si128();
  }
  return _mm256_set_m128i(l[1], l[0]);
}
#endif

// A vector of the f16 values at p, as floats.
inline FVec HalvesToF(const uint8_t* p) {
#if SPECULA_QUANT_WIDTH == 512
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
}

// One group of kG activations to int8: scale amax / 127, each value rounded to nearest even (as
// nearbyint does under the default rounding mode); returns the scale, *sum the values' sum. The
// AVX-512 form gives the same bits as the loops: max and integer sums are exact, and both multiply
// by the same inverse and round the same way. (The loops took 85 cycles a group, a tenth of a
// 5-token verification's products.)
template <int kG>
inline float QuantizeGroup(const float* xg, int8_t* v, int32_t* sum) {
#if SPECULA_QUANT_WIDTH == 512
  if constexpr (kG % 16 == 0 && kG <= 32) {  // (maskz forms: GCC 12's plain ones warn, bug 105593)
    const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
    __m512 a[kG / 16], m = _mm512_setzero_ps();
    for (int h = 0; h < kG / 16; ++h) {
      a[h] = _mm512_loadu_ps(xg + 16 * h);
      m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_castsi512_ps(_mm512_maskz_and_epi32(0xFFFF, _mm512_castps_si512(a[h]), magnitude)));
    }
    // Every lane's max, then its sum below, by a tree of shuffles (a store and a scalar loop cost a
    // quarter of the group).
    m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_maskz_shuffle_f32x4(0xFFFF, m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_maskz_shuffle_f32x4(0xFFFF, m, m, _MM_SHUFFLE(2, 3, 0, 1)));
    m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_maskz_permute_ps(0xFFFF, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm512_maskz_max_ps(0xFFFF, m, _mm512_maskz_permute_ps(0xFFFF, m, _MM_SHUFFLE(2, 3, 0, 1)));
    const float amax = _mm512_cvtss_f32(m);
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m512i total = _mm512_setzero_si512();
    for (int h = 0; h < kG / 16; ++h) {
      const __m512i r = _mm512_maskz_cvt_roundps_epi32(0xFFFF, _mm512_mul_ps(a[h], inv),
                                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(v + 16 * h), _mm512_maskz_cvtsepi32_epi8(0xFFFF, r));
      total = _mm512_add_epi32(total, r);
    }
    total = _mm512_add_epi32(total, _mm512_maskz_shuffle_i32x4(0xFFFF, total, total, _MM_SHUFFLE(1, 0, 3, 2)));
    total = _mm512_add_epi32(total, _mm512_maskz_shuffle_i32x4(0xFFFF, total, total, _MM_SHUFFLE(2, 3, 0, 1)));
    total = _mm512_add_epi32(total, _mm512_maskz_shuffle_epi32(0xFFFF, total, _MM_PERM_BADC));
    total = _mm512_add_epi32(total, _mm512_maskz_shuffle_epi32(0xFFFF, total, _MM_PERM_CDAB));
    *sum = _mm512_cvtsi512_si32(total);
    return amax / 127.0f;
  }
#endif
  float amax = 0.0f;
#pragma omp simd reduction(max : amax)
  for (int j = 0; j < kG; ++j) amax = std::max(amax, std::fabs(xg[j]));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t total = 0;
#pragma omp simd reduction(+ : total)
  for (int j = 0; j < kG; ++j) {
    const int32_t r = static_cast<int32_t>(std::nearbyint(xg[j] * inv));
    v[j] = static_cast<int8_t>(r);
    total += r;
  }
  *sum = total;
  return amax / 127.0f;
}

// Q8_0's signed values as the products take them: w + 128 for VNNI's unsigned-by-signed products,
// else |w| with the signs kept for the activations.
inline void SignedWeights(IVec v, IVec* w, IVec* sign) {
  if constexpr (kVnni) {
    *w = Xor(v, Bytes(static_cast<char>(0x80)));
  } else {
    *w = Abs8(v);
    *sign = v;
  }
}

// The calling thread's scratch for one call's quantized activations, reused from call to call and
// read by every thread of the call: `q_bytes` of int8 values, then three arrays of `entries` 4-byte
// values (scales, scaled sums, integer offsets), each 64-byte aligned.
struct ActsScratch {
  int8_t* q;
  float* d;
  float* s;
  int32_t* off;
};
inline ActsScratch GetActsScratch(int64_t q_bytes, int64_t entries) {
  const auto round64 = [](int64_t b) { return (b + 63) / 64 * 64; };
  const int64_t qb = round64(q_bytes), fb = round64(entries * 4);
  thread_local std::vector<uint8_t> buf;
  // 512 bytes of slack: AMX's tile loads read 16 tokens' values where fewer remain (tile_gemm.cc).
  buf.resize(static_cast<size_t>(qb + 3 * fb + 64 + 512));
  uint8_t* base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  return ActsScratch{reinterpret_cast<int8_t*>(base), reinterpret_cast<float*>(base + qb),
                     reinterpret_cast<float*>(base + qb + fb), reinterpret_cast<int32_t*>(base + qb + 2 * fb)};
}

// The first count floats at p, the rest zero.
inline FVec LoadFirst(const float* p, int32_t count) {
#if SPECULA_QUANT_WIDTH == 512
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), p);
#else
  alignas(32) float t[8] = {};
  std::memcpy(t, p, sizeof(float) * count);
  return _mm256_load_ps(t);
#endif
}
#endif  // SPECULA_QUANT_WIDTH

}  // namespace
}  // namespace specula::cpu

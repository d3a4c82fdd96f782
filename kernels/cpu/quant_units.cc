// The integer products of kernels/cpu/quant_gemm.h (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K), for the matrices
// and the builds that have them (IntegerProducts, kernels/cpu/quant_units.h).
//
// Groups. Every weight type is a sequence of groups of values with one scale each (and an offset
// or a min): the blocks of 32 of Q4_0, Q4_1 and Q8_0, the sub-blocks of 32 of Q4_K and of 16 of
// Q6_K. Each row of x is quantized once per call to int8 with one float scale per group of the same
// size: finer than llama.cpp's Q8_K (one scale per 256 values for the K types), and free here since
// every group's integer dot product gets its own float multiply anyway.
//
// Units. A weight row goes 4 * kV groups at a time (kV: 128-bit lanes per vector, 4 with AVX-512,
// 2 with AVX2). A unit's weights are unpacked to unsigned bytes in 4 vectors (x 2 halves for groups
// of 32) whose 128-bit lanes each hold 16 values of one group: vector s, lane t holds group
// kV s + t. A whole unit is then transposed once (TransposeUnit, a 4 x 4 dword transpose in each
// lane), so that vector j holds values 4j..4j+3 of every group, group kV s + t in 32-bit lane
// 4t + s; the activations are stored in that arrangement, and u8 x s8 dot products (vpdpbusd with
// VNNI, else vpmaddubsw + vpmaddwd) accumulate each group's exact integer dot product in its own
// lane with no reduction per token. It is converted to float and scaled once: one FMA per 16
// groups with the weight scales in the same lane order, instead of a broadcast and a horizontal sum
// per block. The weight scales of a unit come in with one gather (Q4_0, Q4_1, Q8_0) or one byte
// shuffle of the scale bytes (K types). A row's float accumulators are summed 16 rows at a time,
// one row per lane (SumLanes).
//
// Per group (w: the weight values as stored, x: the activation's int8 values, dx: its scale,
// idot = sum w x, sum = sum x):
//   Q4_0: y += d  * (dx * (idot - 8 sum))           Q4_1: y += d * (dx * idot) + m * (dx * sum)
//   Q8_0: y += d  * (dx * idot)                     Q4_K: y += (d sc) * (dx * idot) - (dmin mn) * (dx * sum)
//   Q6_K: y += (d sc) * (dx * (idot - 32 sum))
// (Q8_0 with VNNI: vpdpbusd wants unsigned weights, so they go in as w + 128 and idot - 128 sum.)
//
// A row that is not a whole number of units ends in a partial one. Where its groups divide a unit
// (SmolLM2's rows of 576: 2 groups), the partial units of 16 / rest rows go together as one unit
// (CrossTails); otherwise each is unpacked and multiplied only as far as its groups go, its 4 int32
// partial sums per group reduced in lanes (ReducePartial). Rows are prefetched 8 KB ahead.
//
// Tokens. A unit is unpacked once for up to kBlock = 16 activation rows (two per token with two-term
// activations); more go through tiles of kTileRows weight rows, which stay in L1 while the blocks of
// rows go through them. A token's output is the same sequence of operations whatever the block of
// tokens around it: results do not depend on m (nor on the number of threads), bit for bit.
//
// Q4_1 and Q8_0 matrices that the CPU backend has repacked go through row tiles instead
// (tile_gemm.h): one row per 32-bit lane, 4 activation bytes broadcast per dot product, so that a
// block's unpacking serves every row of the tile and up to 16 tokens without reductions. On a Zen 5
// EPYC (quant_gemm_bench, 2 threads, weights hot) against this file's units: Q4_1 gate/up at 5
// tokens 19-24 -> 8.7 us, at 64 tokens 172-192 -> 90-93; Q8_0 gate/up at 5 tokens 19-21 -> 8.4-8.8,
// at 64 175-179 -> 87-91, and its 49,152 x 576 output head at one token from memory 836-965 ->
// 672-701.
#include "kernels/cpu/quant_units.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <optional>
#include <vector>

#include "core/quant.h"
#include "kernels/cpu/parallel_rows.h"
#include "kernels/cpu/quant_vec.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/tile_gemm.h"

namespace specula::cpu {
namespace {

// The vector layer (IVec, FVec, Reduce, Transpose4, ...) is in kernels/cpu/quant_vec.h.
#if defined(SPECULA_QUANT_WIDTH)

constexpr int kUnitGroups = 4 * kV;  // groups per unit
constexpr int kVecBytes = 16 * kV;
// The group of a unit in lane l of its group vectors.
constexpr int LaneGroup(int l) { return kV * (l % 4) + l / 4; }

inline float HalfToF(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// One unit of a weight row, unpacked. Prepare leaves it by group: w[s][h], lane t holds the 16
// values of half h of group kV s + t. A full unit is then transposed (TransposeUnit): w[j][h],
// dword 4t + s holds values 4j..4j+3 of half h of group kV s + t, so that the dot products of all
// the groups accumulate in lane order with no reduction per token (UnitDotT).
struct Unit {
  IVec w[4][2];     // unsigned weight bytes
  IVec sign[4][2];  // Q8_0 without VNNI: the signed weights, whose signs go onto the activations
  FVec a, b;        // per group, in lane order: the scale and the min coefficient (table above)
};

template <class T>
inline void TransposeUnit(Unit* u) {
  for (int h = 0; h < T::kH; ++h) {
    IVec v[4] = {u->w[0][h], u->w[1][h], u->w[2][h], u->w[3][h]};
    Transpose4(v);
    for (int j = 0; j < 4; ++j) u->w[j][h] = v[j];
    if constexpr (T::kSigned && !kVnni) {
      IVec g[4] = {u->sign[0][h], u->sign[1][h], u->sign[2][h], u->sign[3][h]};
      Transpose4(g);
      for (int j = 0; j < 4; ++j) u->sign[j][h] = g[j];
    }
  }
}

#if SPECULA_QUANT_WIDTH == 512
// kLaneMasks[ng]: the lanes of a unit's group vectors that hold groups below ng.
constexpr auto kLaneMasks = [] {
  std::array<__mmask16, kUnitGroups + 1> masks{};
  for (int ng = 0; ng <= kUnitGroups; ++ng) {
    for (int l = 0; l < kUnitGroups; ++l) masks[ng] |= static_cast<__mmask16>((LaneGroup(l) < ng ? 1 : 0) << l);
  }
  return masks;
}();
#endif

// The f16 scale d (and Q4_1's min m, the next 2 bytes) of each block of a unit of blocks of
// kBytes, in lane order; blocks past `ng` give 0.
template <int kBytes, bool kFull>
inline void BlockScales(const uint8_t* blk, int ng, FVec* d, FVec* m) {
#if SPECULA_QUANT_WIDTH == 512
  // One gather of the first 4 bytes of the 16 blocks (kept inside each block).
  const __m512i idx = _mm512_setr_epi32(0 * kBytes, 4 * kBytes, 8 * kBytes, 12 * kBytes, 1 * kBytes, 5 * kBytes,
                                        9 * kBytes, 13 * kBytes, 2 * kBytes, 6 * kBytes, 10 * kBytes, 14 * kBytes,
                                        3 * kBytes, 7 * kBytes, 11 * kBytes, 15 * kBytes);
  const __m512i words = _mm512_mask_i32gather_epi32(ZeroI(), kFull ? 0xFFFF : kLaneMasks[ng], idx, blk, 1);
  *d = _mm512_maskz_cvtph_ps(0xFFFF, _mm512_maskz_cvtepi32_epi16(0xFFFF, words));
  if (m != nullptr) {
    *m = _mm512_maskz_cvtph_ps(0xFFFF, _mm512_maskz_cvtepi32_epi16(0xFFFF, _mm512_maskz_srli_epi32(0xFFFF, words, 16)));
  }
#else
  // Scalar loads: AVX2 gathers are slow on several of the CPUs this path is for.
  alignas(16) uint16_t dh[8] = {}, mh[8] = {};
  for (int l = 0; l < 8; ++l) {
    if (kFull || LaneGroup(l) < ng) {
      std::memcpy(&dh[l], blk + LaneGroup(l) * kBytes, 2);
      std::memcpy(&mh[l], blk + LaneGroup(l) * kBytes + 2, 2);
    }
  }
  *d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh)));
  if (m != nullptr) *m = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(mh)));
#endif
}

// Q4_0 and Q4_1: 16 bytes of nibbles per block at offset kQs of kBytes, value j in the low nibble of
// byte j, value j + 16 in its high nibble: the two halves of the group.
template <int kBytes, int kQs, bool kFull, int kAccs>
inline void UnpackNibbleBlocks(const uint8_t* blk, int ng, Unit* u) {
  for (int s = 0; s < kAccs; ++s) {
    const IVec v = LoadLanes<kFull>(blk + static_cast<int64_t>(kV * s) * kBytes + kQs, kBytes, ng - kV * s);
    u->w[s][0] = And(v, Bytes(0x0F));
    u->w[s][1] = And(Shr4(v), Bytes(0x0F));
  }
}

// The weight types. kGroup: values per group; kH: 16-byte halves per group; kOffset: the weight's
// zero point (c in idot - c sum); kMin: a min term; kSigned: int8 weights (Q8_0); kSmall: weights
// below 16, so that two vpmaddubsw results add in int16 without saturating. Prepare<kFull, kAccs>
// unpacks a unit: a full one, or the partial last one of a row (ng groups), of which only the
// first kAccs = ceil(ng / kV) vectors are filled (and used: a row of 18 blocks, SmolLM2's 576, ends
// in 2 blocks, which cost a quarter of a unit instead of a whole one).
struct Q4_0Kernel {
  static constexpr int kGroup = 32, kH = 2, kOffset = 8, kBlockBytes = sizeof(BlockQ4_0);
  static constexpr bool kMin = false, kSigned = false, kSmall = true, kCross = true;
  template <bool kFull, int kAccs>
  static void Prepare(const uint8_t* row, int64_t unit, int ng, Unit* u) {
    const uint8_t* blk = row + unit * kUnitGroups * static_cast<int64_t>(sizeof(BlockQ4_0));
    UnpackNibbleBlocks<sizeof(BlockQ4_0), offsetof(BlockQ4_0, qs), kFull, kAccs>(blk, ng, u);
    BlockScales<sizeof(BlockQ4_0), kFull>(blk, ng, &u->a, nullptr);
  }
};

struct Q4_1Kernel {
  static constexpr int kGroup = 32, kH = 2, kOffset = 0, kBlockBytes = sizeof(BlockQ4_1);
  static constexpr bool kMin = true, kSigned = false, kSmall = true, kCross = true;
  template <bool kFull, int kAccs>
  static void Prepare(const uint8_t* row, int64_t unit, int ng, Unit* u) {
    const uint8_t* blk = row + unit * kUnitGroups * static_cast<int64_t>(sizeof(BlockQ4_1));
    UnpackNibbleBlocks<sizeof(BlockQ4_1), offsetof(BlockQ4_1, qs), kFull, kAccs>(blk, ng, u);
    BlockScales<sizeof(BlockQ4_1), kFull>(blk, ng, &u->a, &u->b);
  }
};

struct Q8_0Kernel {
  static constexpr int kGroup = 32, kH = 2, kOffset = kVnni ? 128 : 0, kBlockBytes = sizeof(BlockQ8_0);
  static constexpr bool kMin = false, kSigned = true, kSmall = false, kCross = true;
  template <bool kFull, int kAccs>
  static void Prepare(const uint8_t* row, int64_t unit, int ng, Unit* u) {
    constexpr int kBytes = sizeof(BlockQ8_0);
    const uint8_t* blk = row + unit * kUnitGroups * static_cast<int64_t>(kBytes);
    for (int s = 0; s < kAccs; ++s) {
      __m256i q[kV];  // the 32 values of block kV s + t
      for (int t = 0; t < kV; ++t) {
        q[t] = kFull || kV * s + t < ng
                   ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (kV * s + t) * kBytes + 2))
                   : _mm256_setzero_si256();
      }
#if SPECULA_QUANT_WIDTH == 512
      const __m512i q01 = Concat(q[0], q[1]), q23 = Concat(q[2], q[3]);
      const IVec h[2] = {_mm512_maskz_shuffle_i64x2(0xFF, q01, q23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_maskz_shuffle_i64x2(0xFF, q01, q23, _MM_SHUFFLE(3, 1, 3, 1))};
#else
      const IVec h[2] = {_mm256_permute2x128_si256(q[0], q[1], 0x20), _mm256_permute2x128_si256(q[0], q[1], 0x31)};
#endif
      for (int i = 0; i < 2; ++i) SignedWeights(h[i], &u->w[s][i], &u->sign[s][i]);
    }
    BlockScales<kBytes, kFull>(blk, ng, &u->a, nullptr);
  }
};

// Q4_K's 6-bit scales and mins of sub-blocks 0..7 (Q4KScaleMin) as bytes in 4 words: sc[0..3],
// sc[4..7], mn[0..3], mn[4..7]. The high 2 bits of sub-blocks 4..7 sit in the top of bytes 0..7.
inline void Q4KScaleWords(const uint8_t* scales, uint32_t* sc, uint32_t* mn) {
  uint32_t w[3];
  std::memcpy(w, scales, sizeof(w));
  sc[0] = w[0] & 0x3F3F3F3Fu;
  sc[1] = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u);
  mn[0] = w[1] & 0x3F3F3F3Fu;
  mn[1] = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 2) & 0x30303030u);
}

// A unit is kV / 2 superblocks: 8 groups of 32 each, the low nibbles of 32 bytes one sub-block and
// their high nibbles the next.
struct Q4KKernel {
  static constexpr int kGroup = 32, kH = 2, kOffset = 0;
  static constexpr bool kMin = true, kSigned = false, kSmall = true, kCross = false;
  static constexpr int kBlockBytes = 0;  // no cross units (Acts::rest)
  template <bool kFull, int kAccs>
  static void Prepare(const uint8_t* row, int64_t unit, int ng, Unit* u) {
    constexpr int kSupers = kV / 2, kBytes = sizeof(BlockQ4_K);
    const uint8_t* sb = row + unit * kSupers * kBytes;
    alignas(16) uint32_t sc[4] = {}, mn[4] = {};
    float d[2] = {}, dmin[2] = {};
    for (int b = 0; b < kSupers; ++b) {
      if (!kFull && b * 8 >= ng) {  // a row of an odd number of superblocks (AVX-512)
        for (int s = 4 / kSupers * b; s < 4 / kSupers * (b + 1); ++s) u->w[s][0] = u->w[s][1] = ZeroI();
        continue;
      }
      const uint8_t* p = sb + b * kBytes;
      d[b] = HalfToF(p + offsetof(BlockQ4_K, d));
      dmin[b] = HalfToF(p + offsetof(BlockQ4_K, dmin));
      Q4KScaleWords(p + offsetof(BlockQ4_K, scales), sc + 2 * b, mn + 2 * b);
      const uint8_t* q = p + offsetof(BlockQ4_K, qs);
#if SPECULA_QUANT_WIDTH == 512
      // 64 bytes: sub-blocks 4c (low nibbles, lanes 0-1), 4c + 2 (lanes 2-3), 4c + 1 and 4c + 3 (high).
      const __m512i lo_half = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);  // values 0..15 of each
      const __m512i hi_half = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
      for (int c = 0; c < 2; ++c) {
        const IVec v = LoadI(q + 64 * c), lo = And(v, Bytes(0x0F)), hi = And(Shr4(v), Bytes(0x0F));
        u->w[2 * b + c][0] = _mm512_permutex2var_epi64(lo, lo_half, hi);
        u->w[2 * b + c][1] = _mm512_permutex2var_epi64(lo, hi_half, hi);
      }
#else
      for (int s = 0; s < 4; ++s) {  // 32 bytes: sub-block 2s (low nibbles), 2s + 1 (high)
        const IVec v = LoadI(q + 32 * s), lo = And(v, Bytes(0x0F)), hi = And(Shr4(v), Bytes(0x0F));
        u->w[s][0] = _mm256_permute2x128_si256(lo, hi, 0x20);
        u->w[s][1] = _mm256_permute2x128_si256(lo, hi, 0x31);
      }
#endif
    }
    const __m128i order = LaneOrder();
    u->a = MulF(BytesToF(_mm_shuffle_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(sc)), order)),
                PerSuper(d[0], d[1]));
    u->b = MulF(BytesToF(_mm_shuffle_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(mn)), order)),
                PerSuper(-dmin[0], -dmin[1]));
  }
};

// A unit is 4 kV groups of 16 (AVX-512: a superblock; AVX2: half of one). 6-bit values: low nibbles
// in ql, 2 high bits in qh; in each half of 128, ql[l] and ql[l + 32] hold values l, l + 32 (low
// nibbles) and l + 64, l + 96 (high), qh[l] their high bits in bit pairs 0, 2, 4, 6.
struct Q6KKernel {
  static constexpr int kGroup = 16, kH = 1, kOffset = 32;
  static constexpr bool kMin = false, kSigned = false, kSmall = false, kCross = false;
  static constexpr int kBlockBytes = 0;
  template <bool kFull, int kAccs>
  static void Prepare(const uint8_t* row, int64_t unit, int ng, Unit* u) {
    constexpr int kHalves = 2 / (kV / 2);  // units per superblock
    const uint8_t* p = row + unit / kHalves * static_cast<int64_t>(sizeof(BlockQ6_K));
    const uint8_t* ql = p + offsetof(BlockQ6_K, ql);
    const uint8_t* qh = p + offsetof(BlockQ6_K, qh);
    const IVec low = Bytes(0x0F), high = Bytes(0x30);
#if SPECULA_QUANT_WIDTH == 512
    const __m512i shl = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), shr = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    for (int n = 0; n < 2; ++n) {
      const IVec l = LoadI(ql + 64 * n);
      const __m256i h256 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * n));
      const IVec h = Concat(h256, h256);
      u->w[2 * n][0] = Or(And(l, low), And(_mm512_maskz_sllv_epi64(0xFF, h, shl), high));  // values 0..63 of the half
      u->w[2 * n + 1][0] = Or(And(Shr4(l), low), And(_mm512_maskz_srlv_epi64(0xFF, h, shr), high));  // 64..127
    }
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + offsetof(BlockQ6_K, scales)));
#else
    const int n = static_cast<int>(unit % 2);
    const IVec l0 = LoadI(ql + 64 * n), l1 = LoadI(ql + 64 * n + 32), h = LoadI(qh + 32 * n);
    u->w[0][0] = Or(And(l0, low), And(_mm256_slli_epi16(h, 4), high));
    u->w[1][0] = Or(And(l1, low), And(_mm256_slli_epi16(h, 2), high));
    u->w[2][0] = Or(And(Shr4(l0), low), And(h, high));
    u->w[3][0] = Or(And(Shr4(l1), low), And(_mm256_srli_epi16(h, 2), high));
    const __m128i sc = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + offsetof(BlockQ6_K, scales) + 8 * n));
#endif
    u->a = MulF(SBytesToF(_mm_shuffle_epi8(sc, LaneOrder())), SetF(HalfToF(p + offsetof(BlockQ6_K, d))));
  }
};

// The activations of one call: each row of x quantized per group of G values (round to nearest,
// scale amax / 127), the bytes arranged like the unpacked weights (transposed in full units, by
// group in a partial last one), the per-group terms in lane order. Groups past k (the rest of the
// last unit) are zero.
struct Acts {
  const int8_t* qs;    // [m, units * kUnitGroups * G]
  const float* d;      // [m, units * kUnitGroups]: each group's scale
  const float* ds;     // [m, units * kUnitGroups]: d * sum(q) (the min term)
  const int32_t* off;  // [m, units * kUnitGroups]: kOffset * sum(q) (the zero-point term)
  int64_t units;       // per token, the cross unit included
  // Rows whose last unit is partial with `rest` groups, rest dividing kUnitGroups (SmolLM2's 576:
  // 2 groups), take those groups kUnitGroups / rest rows at a time (CrossTails): the token's last
  // unit (index units - 1) then holds its `rest` last groups repeated, transposed. 0: no cross unit.
  int rest;
};

// The groups of a row's partial last unit where they divide a unit, so that the ends of kUnitGroups
// / rest rows make one whole unit (CrossTails); 0 where
// the last unit is whole or its groups do not divide one.
constexpr int CrossRest(int64_t groups) {
  const int rest = static_cast<int>(groups % kUnitGroups);
  return rest > 0 && kUnitGroups % rest == 0 ? rest : 0;
}

template <class T>
Acts QuantizeActs(const float* x, int32_t m, int32_t k) {
  constexpr int kG = T::kGroup, kUnitBytes = kUnitGroups * kG;
  const int64_t full_units = k / kUnitBytes;
  const int rest = T::kCross ? CrossRest(k / kG) : 0;
  const bool cross = rest > 0;
  const int64_t units = (k + kUnitBytes - 1) / kUnitBytes + (cross ? 1 : 0), groups = units * kUnitGroups;
  const ActsScratch scratch = GetActsScratch(m * units * kUnitBytes, m * groups);
  int8_t* qs = scratch.q;
  float *d = scratch.d, *ds = scratch.s;
  int32_t* off = scratch.off;
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(m) * k >= (1 << 16))
  for (int32_t i = 0; i < m; ++i) {
    for (int64_t g = 0; g < groups - (cross ? kUnitGroups : 0); ++g) {
      const int64_t u = g / kUnitGroups;
      const int gu = static_cast<int>(g % kUnitGroups), s = gu / kV, t = gu % kV;
      const int64_t lane = i * groups + u * kUnitGroups + 4 * t + s;
      int8_t* q = qs + (i * units + u) * kUnitBytes + (s * T::kH * kV + t) * 16;  // half h at + h * kVecBytes
      int8_t v[kG] = {};
      int32_t sum = 0;
      float scale = 0.0f;
      if (g * kG < k) scale = QuantizeGroup<kG>(x + static_cast<int64_t>(i) * k + g * kG, v, &sum);
      if (u < full_units) {  // values 16h + 4j..+3 to dword 4t + s of vector j kH + h
        int8_t* base_u = qs + (i * units + u) * kUnitBytes;
        for (int h = 0; h < T::kH; ++h) {
          for (int j = 0; j < 4; ++j) {
            std::memcpy(base_u + ((j * T::kH + h) * kV + t) * 16 + 4 * s, v + 16 * h + 4 * j, 4);
          }
        }
      } else {
        for (int h = 0; h < T::kH; ++h) std::memcpy(q + h * kVecBytes, v + 16 * h, 16);
      }
      d[lane] = scale;
      ds[lane] = scale * static_cast<float>(sum);
      off[lane] = T::kOffset * sum;
      if (cross && u == full_units && g * kG < k) {  // group gt of the tail to lanes q = j rest + gt
        int8_t* tail = qs + (i * units + units - 1) * kUnitBytes;
        for (int q = static_cast<int>(g - full_units * kUnitGroups); q < kUnitGroups; q += rest) {
          const int qs_ = q / kV, qt = q % kV;
          for (int h = 0; h < T::kH; ++h) {
            for (int j = 0; j < 4; ++j) {
              std::memcpy(tail + ((j * T::kH + h) * kV + qt) * 16 + 4 * qs_, v + 16 * h + 4 * j, 4);
            }
          }
          const int64_t tl = i * groups + (units - 1) * kUnitGroups + 4 * qt + qs_;
          d[tl] = scale;
          ds[tl] = scale * static_cast<float>(sum);
          off[tl] = T::kOffset * sum;
        }
      }
    }
  }
  return Acts{qs, d, ds, off, units, rest};
}

// Reduce for the partial last unit of a row, whose groups all lie in its first kAccs vectors: one
// or two vectors reduce with 4 instructions instead of 9. Lanes 4t + s for s >= kAccs get copies
// of the real sums instead of zeros; those groups' scales are zero.
template <int kAccs>
inline IVec ReducePartial(const IVec a[4]) {
  if constexpr (kAccs == 1) {
    const IVec r = Add32(a[0], SwapHalves(a[0]));
    return Add32(r, SwapPairs(r));
  } else if constexpr (kAccs == 2) {
    const IVec r = Add32(Lo32(a[0], a[1]), Hi32(a[0], a[1]));
    return Add32(r, SwapHalves(r));
  } else {
    return Reduce(a);
  }
}

// The unit's group dot products with one token's activations, lane 4t + s.
template <class T, int kAccs>
inline __attribute__((always_inline)) IVec UnitDot(const Unit& w, const int8_t* xq) {
  IVec acc[4] = {ZeroI(), ZeroI(), ZeroI(), ZeroI()};
  for (int s = 0; s < kAccs; ++s) {
    IVec x[T::kH];
    for (int h = 0; h < T::kH; ++h) {
      x[h] = LoadI(xq + (s * T::kH + h) * kVecBytes);
      if constexpr (T::kSigned && !kVnni) x[h] = Sign8(x[h], w.sign[s][h]);
    }
#if SPECULA_QUANT_WIDTH == 512 && defined(__AVX512VNNI__)
    acc[s] = _mm512_dpbusd_epi32(ZeroI(), w.w[s][0], x[0]);
    if constexpr (T::kH == 2) acc[s] = _mm512_dpbusd_epi32(acc[s], w.w[s][1], x[1]);
#else
    if constexpr (T::kH == 2 && T::kSmall) {  // pairs of products below 2 * 15 * 127: add in int16
      acc[s] = Madd1(Add16(Maddubs(w.w[s][0], x[0]), Maddubs(w.w[s][1], x[1])), ZeroI());
    } else {  // |w| <= 128, |x| <= 127: each int16 pair sum fits
      acc[s] = Madd1(Maddubs(w.w[s][0], x[0]), ZeroI());
      if constexpr (T::kH == 2) acc[s] = Madd1(Maddubs(w.w[s][1], x[1]), acc[s]);
    }
#endif
  }
  return ReducePartial<kAccs>(acc);
}

// The same for a transposed unit: each group's dot product accumulates in its own lane.
template <class T>
inline __attribute__((always_inline)) IVec UnitDotT(const Unit& w, const int8_t* xq) {
  IVec acc[T::kH];
  for (int h = 0; h < T::kH; ++h) acc[h] = ZeroI();
  for (int j = 0; j < 4; ++j) {
    IVec x[T::kH];
    for (int h = 0; h < T::kH; ++h) {
      x[h] = LoadI(xq + (j * T::kH + h) * kVecBytes);
      if constexpr (T::kSigned && !kVnni) x[h] = Sign8(x[h], w.sign[j][h]);
    }
#if SPECULA_QUANT_WIDTH == 512 && defined(__AVX512VNNI__)
    for (int h = 0; h < T::kH; ++h) acc[h] = _mm512_dpbusd_epi32(acc[h], w.w[j][h], x[h]);
#else
    if constexpr (T::kH == 2 && T::kSmall) {
      acc[0] = Madd1(Add16(Maddubs(w.w[j][0], x[0]), Maddubs(w.w[j][1], x[1])), acc[0]);
    } else {
      for (int h = 0; h < T::kH; ++h) acc[h] = Madd1(Maddubs(w.w[j][h], x[h]), acc[h]);
    }
#endif
  }
  if constexpr (T::kH == 2) return Add32(acc[0], acc[1]);
  return acc[0];
}

// The horizontal sums of a row's accumulators are taken kSumRows rows at a time, one row per lane
// of the result (SumLanes): the same tree of adds for every row, 2 instructions a row instead of 8.
constexpr int kSumRows = 4 * kV;

// Weights are prefetched this far ahead of the row being read: the hardware prefetcher alone left
// a matrix that comes from memory at 60% of the read bandwidth (Q4_1 at one token, 49152 x 576
// from a 1 GiB rotation, 2 threads: 11.5 GB/s without, 16.5 GB/s with 8 KB; Q8_0 13.6 -> 19.4,
// the bandwidth of a plain float sum), and it costs nothing on a matrix in cache.
constexpr int64_t kPrefetchBytes = 8192;

// How a cross unit's lanes add up to rows (CrossTails): lane j0 + j (j < rows) of RowSums' result is
// the sum over g < rest of the lane holding group j rest + g (lane 4t + s holds group kV s + t).
struct RowMap {
  alignas(64) int32_t idx[8][kUnitGroups];  // [g][lane]: the source lane
  alignas(64) int32_t keep[kUnitGroups];    // -1 in lanes j0 .. j0 + rows - 1
  uint32_t mask = 0;
  RowMap(int rest, int j0, int rows) {
    for (int l = 0; l < kUnitGroups; ++l) keep[l] = l >= j0 && l < j0 + rows ? -1 : 0;
    for (int g = 0; g < rest; ++g) {
      for (int l = 0; l < kUnitGroups; ++l) {
        const int q = (l >= j0 && l < j0 + rows ? l - j0 : 0) * rest + g;
        idx[g][l] = 4 * (q % kV) + q / kV;
      }
    }
    for (int j = 0; j < rows; ++j) mask |= 1u << (j0 + j);
  }
};

// The map of a whole cross unit (kUnitGroups / rest rows from j0), built once: the same in every
// call, and building it cost as much as the unit's products at one token.
inline const RowMap& WholeRowMap(int rest, int j0) {
  static const auto maps = [] {
    std::array<std::vector<RowMap>, kUnitGroups> m;
    for (int r = 1; r < kUnitGroups; ++r) {
      if (kUnitGroups % r != 0) continue;
      for (int j = 0; j < kUnitGroups; j += kUnitGroups / r) m[r].emplace_back(r, j, kUnitGroups / r);
    }
    return m;
  }();
  return maps[rest][j0 / (kUnitGroups / rest)];
}

inline FVec RowSums(FVec v, const RowMap& map, int rest) {
  FVec out = ZeroF();
  for (int g = 0; g < rest; ++g) {
#if SPECULA_QUANT_WIDTH == 512
    out = out + _mm512_maskz_permutexvar_ps(static_cast<__mmask16>(map.mask), _mm512_load_si512(map.idx[g]), v);
#else
    const __m256 picked = _mm256_permutevar8x32_ps(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(map.idx[g])));
    out = out + _mm256_and_ps(picked, _mm256_load_ps(reinterpret_cast<const float*>(map.keep)));
#endif
  }
  return out;
}

// The partial last units (a.rest groups each) of rows first .. first + count - 1, kUnitGroups /
// rest rows at a time as one unit whose group q = j rest + g is row j's group g: tails[i], lane j,
// is added row first + j's sum over them for token i0 + i. A row's partial unit then costs its share of
// one unit's products instead of a whole unit's unpacking, reduction and scaling: the blocks are
// copied together and transposed.
template <class T, int M>
void CrossTails(const uint8_t* blocks, int64_t row_bytes, int32_t first, int32_t count,
                const Acts& a, int32_t i0, int64_t full, FVec tails[M]) {
  constexpr int kBytes = std::max(T::kBlockBytes, 1);
  const int rest = a.rest, rows = kUnitGroups / rest;
  const int64_t gstride = a.units * kUnitGroups, qstride = gstride * T::kGroup, tu = a.units - 1;
  for (int j0 = 0; j0 < count; j0 += rows) {
    Unit w;
    alignas(64) uint8_t buf[kUnitGroups * kBytes];  // the unit's blocks, side by side; rows past count repeat the last
    for (int q = 0; q < kUnitGroups; ++q) {
      const int32_t j = std::min(j0 + q / rest, count - 1);
      const uint8_t* block = blocks + (first + j) * row_bytes + (full * kUnitGroups + q % rest) * kBytes;
      std::memcpy(buf + q * kBytes, block, kBytes);
    }
    T::template Prepare<true, 4>(buf, 0, kUnitGroups, &w);
    TransposeUnit<T>(&w);
    std::optional<RowMap> partial;  // the last block of a matrix whose rows are not a whole number of units
    const RowMap& map = count - j0 >= rows ? WholeRowMap(rest, j0) : partial.emplace(rest, j0, count - j0);
    for (int i = 0; i < M; ++i) {
      const int64_t ti = i0 + i, gi = ti * gstride + tu * kUnitGroups;
      IVec dot = UnitDotT<T>(w, a.qs + ti * qstride + tu * kUnitGroups * T::kGroup);
      if constexpr (T::kOffset != 0) dot = Sub32(dot, LoadI(a.off + gi));
      FVec v = MulF(MulF(ToF(dot), LoadF(a.d + gi)), w.a);
      if constexpr (T::kMin) v = FmaF(LoadF(a.ds + gi), w.b, v);
      tails[i] = tails[i] + RowSums(v, map, rest);
    }
  }
}

// y[i0 + i, r] = row r . x[i0 + i] + bias[r] for rows r0..r1 and M tokens: each unit of a row is
// unpacked once for all of them. (Rows in one call: a row of 576 is one unit and a quarter, and
// the per-call setup and the horizontal sums cost as much again when they come once per row.)
// (GCC 12 cannot see that a row's first unit sets every acc[i]; Clang and the tests agree it does.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <class T, int M>
void RowsDot(const uint8_t* blocks, int64_t row_bytes, int32_t r0, int32_t r1, const Acts& a, int32_t i0,
             int64_t groups, const float* bias, int32_t n, float* y) {
  FVec sums[M][kSumRows];  // each token's accumulators of the last kSumRows rows
  for (int32_t r = r0; r < r1; ++r) {
    const uint8_t* row = blocks + r * row_bytes;
    if ((r + 1) * row_bytes + kPrefetchBytes <= n * row_bytes) {
      for (int64_t o = 0; o < row_bytes; o += 64) {
        __builtin_prefetch(row + kPrefetchBytes + o);
      }
    }
    FVec acc[M];  // set by the row's first unit (zeroing 32 of them first cost 6% of a prefill)
    const int64_t gstride = a.units * kUnitGroups, qstride = gstride * T::kGroup;
    // kAccs 0: a full, transposed unit. kFirst: the row's first unit. A loop over the tokens, not
    // unrolled: GCC unrolled 3 to 6 tokens completely and kept each token's addresses on the stack
    // (5 tokens took longer than 7; SmolLM2 Q4_1's 5-token step 2.2x -> 1.9x a 1-token step).
    const auto step = [&]<int kAccs, bool kFirst>(int64_t u, const Unit& w) __attribute__((always_inline)) {
#pragma GCC unroll 1
      for (int i = 0; i < M; ++i) {
        const int64_t ti = i0 + i, gi = ti * gstride + u * kUnitGroups;
        const int8_t* xq = a.qs + ti * qstride + u * kUnitGroups * T::kGroup;
        IVec dot;
        if constexpr (kAccs == 0) {
          dot = UnitDotT<T>(w, xq);
        } else {
          dot = UnitDot<T, kAccs>(w, xq);
        }
        if constexpr (T::kOffset != 0) dot = Sub32(dot, LoadI(a.off + gi));
        const FVec scaled = MulF(ToF(dot), LoadF(a.d + gi));
        acc[i] = kFirst ? MulF(scaled, w.a) : FmaF(scaled, w.a, acc[i]);
        if constexpr (T::kMin) acc[i] = FmaF(LoadF(a.ds + gi), w.b, acc[i]);
      }
    };
    const int64_t full = groups / kUnitGroups;
    const auto tail = [&]<int kAccs>(int64_t u, int ng) __attribute__((always_inline)) {
      Unit w;
      T::template Prepare<false, kAccs>(row, u, ng, &w);
      if (full == 0) {
        step.template operator()<kAccs, true>(u, w);
      } else {
        step.template operator()<kAccs, false>(u, w);
      }
    };
    for (int64_t u = 0; u < full; ++u) {
      Unit w;
      T::template Prepare<true, 4>(row, u, kUnitGroups, &w);
      TransposeUnit<T>(&w);
      if (u == 0) {
        step.template operator()<0, true>(u, w);
      } else {
        step.template operator()<0, false>(u, w);
      }
    }
    if (full == 0 && a.rest != 0) {  // only a cross unit
      for (int i = 0; i < M; ++i) acc[i] = ZeroF();
    }
    switch (const int rest = a.rest != 0 ? 0 : static_cast<int>(groups % kUnitGroups); (rest + kV - 1) / kV) {
      case 1: tail.template operator()<1>(full, rest); break;
      case 2: tail.template operator()<2>(full, rest); break;
      case 3: tail.template operator()<3>(full, rest); break;
      case 4: tail.template operator()<4>(full, rest); break;
      default: break;
    }
    for (int i = 0; i < M; ++i) sums[i][(r - r0) % kSumRows] = acc[i];
    if ((r - r0) % kSumRows == kSumRows - 1 || r == r1 - 1) {  // a block of rows: one sum tree per token
      const int32_t first = r - (r - r0) % kSumRows, count = r + 1 - first;
      FVec tails[M];
      for (int i = 0; i < M; ++i) tails[i] = ZeroF();
      if constexpr (T::kCross) {
        if (a.rest != 0) CrossTails<T, M>(blocks, row_bytes, first, count, a, i0, full, tails);
      }
      for (int i = 0; i < M; ++i) {
        for (int j = count; j < kSumRows; ++j) sums[i][j] = ZeroF();
        FVec v = SimdQ::SumLanes(sums[i]);
        if (a.rest != 0) v = v + tails[i];
        if (bias != nullptr) v = v + LoadFirst(bias + first, count);
        SimdQ::StoreFirst(y + static_cast<int64_t>(i0 + i) * n + first, v, count);
      }
    }
  }
}
#pragma GCC diagnostic pop

// Weight rows per tile: 16 rows of a 1536-wide Q8_0 matrix and a block of tokens' activations
// (26 KB + 24 KB) stay in L1 while the blocks of tokens pass.
constexpr int32_t kTileRows = 16;
// Activation rows per unpacking of a unit: the unpacking costs about as much as 4 rows' products.
// 16, not 8 and 32: a 9-token verification's 9 rows ran as 8 + 1 (two terms at 5 tokens: 10 rows,
// 8 + 2), unpacking every unit twice, and 32 rows' accumulators do not fit the 32 registers.
// SmolLM2 Q4_1 on a Zen 5 EPYC: the 9-token step 2.8-3.1x -> 2.4-2.6x a 1-token step, the 600-token
// prefill 1,760-1,820 -> 2,020-2,060 tok/s.
constexpr int32_t kBlock = 16;

// Rows go in tiles of kTileRows over every output of a call (at most kMaxOuts) in one parallel loop,
// the tokens in passes of equal size (at most kBlock).
template <class T>
void GemmQuantRaw(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs) {
  const Acts acts = QuantizeActs<T>(x, m, k);
  const int64_t groups = k / T::kGroup, row_bytes = QuantRowBytes(outs[0].w->type, k);
  using RowsFn = void (*)(const uint8_t*, int64_t, int32_t, int32_t, const Acts&, int32_t, int64_t, const float*,
                          int32_t, float*);
  static constexpr RowsFn kRowsFns[kBlock + 1] = {
      nullptr,         &RowsDot<T, 1>,  &RowsDot<T, 2>,  &RowsDot<T, 3>,  &RowsDot<T, 4>,  &RowsDot<T, 5>,
      &RowsDot<T, 6>,  &RowsDot<T, 7>,  &RowsDot<T, 8>,  &RowsDot<T, 9>,  &RowsDot<T, 10>, &RowsDot<T, 11>,
      &RowsDot<T, 12>, &RowsDot<T, 13>, &RowsDot<T, 14>, &RowsDot<T, 15>, &RowsDot<T, 16>};
  const int32_t size = EqualPassSize(m, kBlock);
  const auto rows_of = [&](int32_t o) { return outs[o].w->rows; };
  ForEachRowTile(num_outs, rows_of, kTileRows, static_cast<int64_t>(k) * m, [&](int32_t o, int32_t r0) {
    const QuantOut& out = outs[o];
    const auto* base = static_cast<const uint8_t*>(out.w->blocks);
    const int32_t n = static_cast<int32_t>(out.w->rows), r1 = std::min(n, r0 + kTileRows);
    // Whole blocks by a direct call, which the compiler specializes (10% faster than through the
    // table).
    for (int32_t i0 = 0; i0 < m; i0 += size) {
      const int32_t rows = std::min(size, m - i0);
      if (rows == kBlock) {
        RowsDot<T, kBlock>(base, row_bytes, r0, r1, acts, i0, groups, out.bias, n, out.y);
      } else {
        kRowsFns[rows](base, row_bytes, r0, r1, acts, i0, groups, out.bias, n, out.y);
      }
    }
  });
}
// Q4_1 and Q8_0 in RepackForProducts' arrangement: row tiles (kernels/cpu/tile_gemm.h), whose
// products quantize the activations their own way.
struct Tiled {
  static constexpr int kGroup = 32;
};
template <>
void GemmQuantRaw<Tiled>(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs) {
  TileProducts(x, m, k, outs, num_outs);
}

// Two-term activations: x = hi + lo, where hi is x as QuantizeActs rounds it and lo is the rest
// (x - hi), which is quantized again. 8-bit activations alone moved SmolLM2-135M's greedy output
// off its float32 path on 10 of 16 prompts within 32 tokens (Q8_0 weights, where the weights are
// nearly exact: 5 of 16 agreed); with the second term the error is ~1/127 of that. Both terms of a
// token go through the same pass over the weights (rows 2i and 2i + 1), so batch 1 stays bound by
// memory. xx[2m, k] = hi_0, lo_0, hi_1, lo_1, ... where "hi_i" is x_i itself.
template <class T>
void SplitActs(const float* x, int32_t m, int32_t k, float* xx) {
  constexpr int kG = T::kGroup;
  for (int32_t i = 0; i < m; ++i) {
    const float* xi = x + static_cast<int64_t>(i) * k;
    float* hi = xx + static_cast<int64_t>(2 * i) * k;
    float* lo = hi + k;
    std::memcpy(hi, xi, sizeof(float) * k);
    for (int32_t g = 0; g < k; g += kG) {
      const int n = std::min<int32_t>(kG, k - g);
      float amax = 0.0f;
      for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(xi[g + j]));
      const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int j = 0; j < n; ++j) lo[g + j] = xi[g + j] - std::nearbyint(xi[g + j] * inv) * scale;
    }
  }
}

template <class T>
void GemmQuant(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs) {
  if (!outs[0].w->two_term_activations) return GemmQuantRaw<T>(x, m, k, outs, num_outs);
  thread_local std::vector<float> xx, yy;  // [2m, k], [2m, the outputs' rows]
  int64_t rows = 0;
  for (int32_t i = 0; i < num_outs; ++i) rows += outs[i].w->rows;
  xx.resize(static_cast<size_t>(2 * m) * k);
  yy.resize(static_cast<size_t>(2 * m) * rows);
  SplitActs<T>(x, m, k, xx.data());
  QuantOut terms[kMaxQuantOuts];  // each output's [2m, n] of both terms, without the bias
  for (int32_t i = 0, at = 0; i < num_outs; at += static_cast<int32_t>(outs[i].w->rows) * 2 * m, ++i) {
    terms[i] = {outs[i].w, nullptr, yy.data() + at};
  }
  GemmQuantRaw<T>(xx.data(), 2 * m, k, terms, num_outs);
  for (int32_t o = 0; o < num_outs; ++o) {
    const int32_t n = static_cast<int32_t>(outs[o].w->rows);
    const float* bias = outs[o].bias;
    for (int32_t i = 0; i < m; ++i) {
      const float* h = terms[o].y + static_cast<int64_t>(2 * i) * n;
      const float* l = h + n;
      float* yi = outs[o].y + static_cast<int64_t>(i) * n;
      for (int32_t r = 0; r < n; ++r) yi[r] = (h[r] + l[r]) + (bias != nullptr ? bias[r] : 0.0f);
    }
  }
}
#endif  // SPECULA_QUANT_WIDTH

}  // namespace

bool IntegerProducts(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs) {
#if defined(SPECULA_QUANT_WIDTH)
  switch (outs[0].w->type) {
    case QuantType::kQ4_0: return GemmQuant<Q4_0Kernel>(x, m, k, outs, num_outs), true;
    case QuantType::kQ4_1:
      if (outs[0].w->repacked) return GemmQuant<Tiled>(x, m, k, outs, num_outs), true;
      return GemmQuant<Q4_1Kernel>(x, m, k, outs, num_outs), true;
    case QuantType::kQ8_0:
      if (outs[0].w->repacked) return GemmQuant<Tiled>(x, m, k, outs, num_outs), true;
      return GemmQuant<Q8_0Kernel>(x, m, k, outs, num_outs), true;
    case QuantType::kQ4_K: return GemmQuant<Q4KKernel>(x, m, k, outs, num_outs), true;
    case QuantType::kQ6_K: return GemmQuant<Q6KKernel>(x, m, k, outs, num_outs), true;
    default: break;
  }
#else
  (void)x, (void)m, (void)k, (void)outs, (void)num_outs;
#endif
  return false;
}

}  // namespace specula::cpu

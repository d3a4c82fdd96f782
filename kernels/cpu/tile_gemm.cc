// Q4_1 and Q8_0 on row tiles (kernels/cpu/tile_gemm.h). The vector layer is kernels/cpu/quant_vec.h's.
#include "kernels/cpu/tile_gemm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "core/quant.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/parallel_rows.h"
#include "kernels/cpu/quant_vec.h"
#include "kernels/cpu/simd.h"

namespace specula::cpu {
namespace {

#if defined(SPECULA_QUANT_WIDTH)
constexpr int kTileRows = 4 * kV;         // rows per tile: one per 32-bit lane
constexpr int kVecBytes = 4 * kTileRows;  // a vector: 4 bytes of each row
// Tokens per unpacking of a block: 16 accumulators fit AVX-512's 32 registers beside the block's 8
// vectors and its scales (SmolLM2 Q4_1 on a Zen 5 EPYC, 16 tokens over 576 x 576: 16 in one pass
// 16.1 us, two of 8 17.8). With AVX2's 16 registers, 8 (some spilled) beat 4 at 5, 8 and 64
// tokens (the same machine without AVX-512: Q4_1 gate/up at 5 tokens 22.3-24.6 us against 25.3-25.7).
constexpr int kMaxTokens = SPECULA_QUANT_WIDTH == 512 ? 16 : 8;
// The weights are prefetched this far ahead of the block being read (they stream from memory at one
// token; 8 KB, as the GGUF arrangement's rows).
constexpr int64_t kPrefetchBytes = 8192;

// The activations quantized per block of 32 (QuantizeGroup): values [blocks, m, 32], so that a
// block's tokens lie together at immediate offsets; their scales dx and dx * sum and the integer
// offset of Q8_0's unsigned weights, 128 sum, [blocks, m].
struct TileActs {
  const int8_t* q;
  const float* dx;
  const float* sx;
  const int32_t* off;
  int32_t m;
};

TileActs QuantizeTileActs(const float* x, int32_t m, int32_t k) {
  const int64_t blocks = k / 32;
  const ActsScratch scratch = GetActsScratch(static_cast<int64_t>(m) * k, m * blocks);
  int8_t* q = scratch.q;
  float *dx = scratch.d, *sx = scratch.s;
  int32_t* off = scratch.off;
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(m) * k >= (1 << 16))
  for (int32_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t sum = 0;
      const int64_t at = b * m + i;
      dx[at] = QuantizeGroup<32>(x + static_cast<int64_t>(i) * k + 32 * b, q + 32 * at, &sum);
      sx[at] = dx[at] * static_cast<float>(sum);
      off[at] = 128 * sum;
    }
  }
  return TileActs{q, dx, sx, off, m};
}

// 4 activation bytes at p in every 32-bit lane.
inline IVec Bcast4(const int8_t* p) {
#if SPECULA_QUANT_WIDTH == 512
  return _mm512_maskz_broadcastd_epi32(0xFFFF, _mm_loadu_si32(p));
#else
  return _mm256_broadcastd_epi32(_mm_loadu_si32(p));
#endif
}
inline IVec Bcast32(const int32_t* p) { return Bcast4(reinterpret_cast<const int8_t*>(p)); }

// The weight types' blocks in a tile. kVecs vectors of 4 bytes per row, then kTileRows f16 scales d
// (and Q4_1's mins m). Unpack reads one block; Dot gives lane r: row r's integer dot product with a
// token's 32 values x.
struct Q4_1Tile {  // vector c: bytes 4c..4c+3 of the row's 16, values 4c.. (low nibbles), 16 + 4c.. (high)
  static constexpr int kVecs = 4, kBlockBytes = sizeof(BlockQ4_1), kQs = offsetof(BlockQ4_1, qs);
  static constexpr bool kMin = true, kOffset = false;
  struct Block {
    IVec lo[4], hi[4];
    FVec d, m;
  };
  struct Scales {
    FVec d, m;
  };
  static Scales ScalesOf(const uint8_t* w) {
    return {HalvesToF(w + kVecs * kVecBytes), HalvesToF(w + kVecs * kVecBytes + 2 * kTileRows)};
  }
  // Vector c's low and high nibbles, each in a byte.
  static __attribute__((always_inline)) void Nibbles(const uint8_t* w, int c, IVec* lo, IVec* hi) {
    const IVec v = LoadI(w + c * kVecBytes);
    *lo = And(v, Bytes(0x0F));
    *hi = And(Shr4(v), Bytes(0x0F));
  }
  static __attribute__((always_inline)) void Unpack(const uint8_t* w, Block* k) {
    for (int c = 0; c < 4; ++c) Nibbles(w, c, &k->lo[c], &k->hi[c]);
    const Scales s = ScalesOf(w);
    k->d = s.d;
    k->m = s.m;
  }
  static __attribute__((always_inline)) IVec Dot(const Block& k, const int8_t* x) {
#if SPECULA_QUANT_WIDTH == 512 && defined(__AVX512VNNI__)
    // Two chains of 4: half the latency of one of 8.
    IVec p0 = _mm512_dpbusd_epi32(ZeroI(), k.lo[0], Bcast4(x));
    IVec p1 = _mm512_dpbusd_epi32(ZeroI(), k.hi[0], Bcast4(x + 16));
    for (int c = 1; c < 4; ++c) {
      p0 = _mm512_dpbusd_epi32(p0, k.lo[c], Bcast4(x + 4 * c));
      p1 = _mm512_dpbusd_epi32(p1, k.hi[c], Bcast4(x + 16 + 4 * c));
    }
    return Add32(p0, p1);
#else
    // Each vpmaddubsw pair is below 2 * 15 * 127 in magnitude, and 8 of them below 2^15: one int16 sum.
    IVec s = Add16(Maddubs(k.lo[0], Bcast4(x)), Maddubs(k.hi[0], Bcast4(x + 16)));
    for (int c = 1; c < 4; ++c) {
      s = Add16(s, Add16(Maddubs(k.lo[c], Bcast4(x + 4 * c)), Maddubs(k.hi[c], Bcast4(x + 16 + 4 * c))));
    }
    return Madd1(s, ZeroI());
#endif
  }
  // AMX's B for the block (kernels/cpu/amx.h): its nibbles as 8 vectors of unsigned bytes in buf[512],
  // values 4j..4j+3 in vector j.
  static constexpr bool kSignedB = false;
  static const void* AmxB(const uint8_t* w, uint8_t* buf) {
    for (int c = 0; c < 4; ++c) {
      IVec lo, hi;
      Nibbles(w, c, &lo, &hi);
      StoreI(buf + c * kVecBytes, lo);
      StoreI(buf + (4 + c) * kVecBytes, hi);
    }
    return buf;
  }
};

struct Q8_0Tile {  // vector c: values 4c..4c+3. With VNNI they go in as w + 128 (less the offset)
  static constexpr int kVecs = 8, kBlockBytes = sizeof(BlockQ8_0), kQs = offsetof(BlockQ8_0, qs);
  static constexpr bool kMin = false, kOffset = kVnni;
  struct Block {
    IVec w[8], sign[8];  // the weights as the products take them; without VNNI, |w| and w's signs
    FVec d;
  };
  struct Scales {
    FVec d;
  };
  static Scales ScalesOf(const uint8_t* w) { return {HalvesToF(w + kVecs * kVecBytes)}; }
  static __attribute__((always_inline)) void Unpack(const uint8_t* w, Block* k) {
    for (int c = 0; c < 8; ++c) SignedWeights(LoadI(w + c * kVecBytes), &k->w[c], &k->sign[c]);
    k->d = ScalesOf(w).d;
  }
  static __attribute__((always_inline)) IVec Dot(const Block& k, const int8_t* x) {
#if SPECULA_QUANT_WIDTH == 512 && defined(__AVX512VNNI__)
    IVec p0 = _mm512_dpbusd_epi32(ZeroI(), k.w[0], Bcast4(x)), p1 = _mm512_dpbusd_epi32(ZeroI(), k.w[1], Bcast4(x + 4));
    for (int c = 2; c < 8; c += 2) {
      p0 = _mm512_dpbusd_epi32(p0, k.w[c], Bcast4(x + 4 * c));
      p1 = _mm512_dpbusd_epi32(p1, k.w[c + 1], Bcast4(x + 4 * c + 4));
    }
    return Add32(p0, p1);
#else
    // |w| <= 128, |x| <= 127: each vpmaddubsw pair fits int16, two do not.
    IVec s = ZeroI();
    for (int c = 0; c < 8; ++c) s = Madd1(Maddubs(k.w[c], Sign8(Bcast4(x + 4 * c), k.sign[c])), s);
    return s;
#endif
  }
  // AMX's B for the block: its 8 vectors as they are, signed.
  static constexpr bool kSignedB = true;
  static const void* AmxB(const uint8_t* w, uint8_t*) { return w; }
};

template <class K>
constexpr int TileBlockBytes() {
  return K::kBlockBytes * kTileRows;
}

// One block's integer dots idot (lane r: row r) into a token's sums, at activation entry `at`.
// s: the block's scales d (and Q4_1's mins m).
template <class K, class S>
__attribute__((always_inline)) inline FVec Accumulate(IVec idot, const S& s, const TileActs& a, int64_t at, FVec acc) {
  acc = FmaF(ToF(idot), MulF(s.d, SetF(a.dx[at])), acc);
  if constexpr (K::kMin) acc = FmaF(s.m, SetF(a.sx[at]), acc);
  return acc;
}

inline void Prefetch(const uint8_t* w, int64_t bytes) {
  // (Past the matrix's end too: a thread's next tile follows, and a prefetch never faults.)
  for (int64_t o = 0; o < bytes; o += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(w) + kPrefetchBytes + o));
  }
}

template <int M>
void StoreTokens(const FVec (&acc)[M], const float* bias, int32_t rows, int64_t ldy, float* y) {
  for (int i = 0; i < M; ++i) {
    const FVec v = bias != nullptr ? acc[i] + LoadFirst(bias, rows) : acc[i];
    SimdQ::StoreFirst(y + i * ldy, v, rows);
  }
}

// y[i, r] (i < M, r < rows, y's rows ldy apart) = tile row r . token i0 + i + bias[r] (bias may be
// null): every block unpacked once for the M tokens, whose sums stay in registers. Per block:
// y += (d dx) idot + m sx (Q4_1), y += (d dx) (idot - off) (Q8_0 with VNNI), y += (d dx) idot.
template <class K, int M>
void TileDot(const uint8_t* w, int64_t blocks, const TileActs& a, int32_t i0, const float* bias, int32_t rows,
             int64_t ldy, float* y) {
  FVec acc[M];
  for (int i = 0; i < M; ++i) acc[i] = ZeroF();
  for (int64_t b = 0; b < blocks; ++b, w += TileBlockBytes<K>()) {
    Prefetch(w, TileBlockBytes<K>());
    typename K::Block k;
    K::Unpack(w, &k);
    const int64_t at = b * a.m + i0;
    const int8_t* xq = a.q + 32 * at;
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) {
      IVec dot = K::Dot(k, xq + 32 * i);
      if constexpr (K::kOffset) dot = Sub32(dot, Bcast32(a.off + at + i));
      acc[i] = Accumulate<K>(dot, k, a, at + i, acc[i]);
    }
  }
  StoreTokens<M>(acc, bias, rows, ldy, y);
}

#if SPECULA_QUANT_WIDTH == 512
// TileDot on AMX's int8 tiles (kernels/cpu/amx.h), Ops: amx::Hw or amx::Emulated. Per block, one tile
// product gives the M tokens' integer dots with the tile's 16 rows (exact, as the vector paths'
// are); the float steps that follow are TileDot's, in its order: the same bits. A's 16 rows are
// always loaded (the configuration is fixed per thread): rows past M read the next tokens or the
// scratch's slack (GetActsScratch), and their dots go unused.
template <class K, class Ops, int M>
void TileDotAmx(const uint8_t* w, int64_t blocks, const TileActs& a, int32_t i0, const float* bias, int32_t rows,
                int64_t ldy, float* y) {
  Ops::Configure();
  alignas(64) int32_t c[16][16];  // [token, row]
  alignas(64) uint8_t b_bytes[8 * kVecBytes];
  FVec acc[M];
  for (int i = 0; i < M; ++i) acc[i] = ZeroF();
  for (int64_t b = 0; b < blocks; ++b, w += TileBlockBytes<K>()) {
    Prefetch(w, TileBlockBytes<K>());
    const int64_t at = b * a.m + i0;
    Ops::LoadA(a.q + 32 * at);
    Ops::LoadB(K::AmxB(w, b_bytes));
    Ops::ZeroC();
    if constexpr (K::kSignedB) {
      Ops::DpSS();
    } else {
      Ops::DpSU();
    }
    Ops::StoreC(&c[0][0]);
    const typename K::Scales s = K::ScalesOf(w);
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) acc[i] = Accumulate<K>(LoadI(c[i]), s, a, at + i, acc[i]);
  }
  StoreTokens<M>(acc, bias, rows, ldy, y);
}
#endif

using TileFn = void (*)(const uint8_t*, int64_t, const TileActs&, int32_t, const float*, int32_t, int64_t, float*);
template <class K, int... I>
constexpr std::array<TileFn, sizeof...(I)> TileFns(std::integer_sequence<int, I...>) {
  return {&TileDot<K, I + 1>...};
}
#if SPECULA_QUANT_WIDTH == 512
template <class K, class Ops, int... I>
constexpr std::array<TileFn, sizeof...(I)> AmxFns(std::integer_sequence<int, I...>) {
  return {&TileDotAmx<K, Ops, I + 1>...};
}
#endif

// The bytes of row r's block b in GGUF's arrangement <-> in its tile: visit(gguf offset, tile
// offset, bytes), relative to the block and to the tile's block.
template <class K, typename Visit>
void BlockPermutation(int lane, Visit visit) {
  for (int c = 0; c < K::kVecs; ++c) visit(K::kQs + 4 * c, c * kVecBytes + 4 * lane, 4);
  visit(0, K::kVecs * kVecBytes + 2 * lane, 2);  // d
  if constexpr (K::kMin) visit(2, K::kVecs * kVecBytes + 2 * kTileRows + 2 * lane, 2);
}

template <class K>
std::vector<uint8_t> Tiles(const QuantMatrix& w) {
  const int64_t blocks = w.cols / 32, tiles = (w.rows + kTileRows - 1) / kTileRows;
  std::vector<uint8_t> out(static_cast<size_t>(tiles * blocks * TileBlockBytes<K>()), 0);
  const auto* src = static_cast<const uint8_t*>(w.blocks);
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = src + (r * blocks + b) * K::kBlockBytes;
      uint8_t* t = &out[static_cast<size_t>((r / kTileRows * blocks + b) * TileBlockBytes<K>())];
      BlockPermutation<K>(r % kTileRows, [&](int from, int to, int n) { std::memcpy(t + to, blk + from, n); });
    }
  }
  return out;
}

template <class K>
void TileRow(const QuantMatrix& w, int64_t r, float* out) {
  const int64_t blocks = w.cols / 32;
  thread_local std::vector<uint8_t> row;  // [blocks * kBlockBytes]: the row in GGUF's arrangement
  row.resize(static_cast<size_t>(blocks * K::kBlockBytes));
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t = static_cast<const uint8_t*>(w.blocks) + (r / kTileRows * blocks + b) * TileBlockBytes<K>();
    uint8_t* gguf = &row[b * K::kBlockBytes];
    BlockPermutation<K>(r % kTileRows, [&](int from, int to, int n) { std::memcpy(gguf + from, t + to, n); });
  }
  DequantizeRow(w.type, row.data(), w.cols, out);
}

// The products of M tokens (index M - 1) that the engine runs for steps of m tokens.
template <class K>
const std::array<TileFn, kMaxTokens>& DotsFor(int32_t m) {
  static constexpr auto kVectorDots = TileFns<K>(std::make_integer_sequence<int, kMaxTokens>());
#if SPECULA_QUANT_WIDTH == 512
  static constexpr auto kAmxDots = AmxFns<K, amx::Hw>(std::make_integer_sequence<int, kMaxTokens>());
  static constexpr auto kEmulatedDots = AmxFns<K, amx::Emulated>(std::make_integer_sequence<int, kMaxTokens>());
  if (AmxServes(m)) return CurrentTileEngine() == TileEngine::kAmx ? kAmxDots : kEmulatedDots;
#endif
  (void)m;
  return kVectorDots;
}

template <class K>
void TileProducts(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs) {
  const std::array<TileFn, kMaxTokens>& kFns = DotsFor<K>(m);
  const TileActs a = QuantizeTileActs(x, m, k);
  const int64_t blocks = k / 32;
  const int32_t per = EqualPassSize(m, kMaxTokens);
  const auto rows_of = [&](int32_t o) { return outs[o].w->rows; };
  ForEachRowTile(num_outs, rows_of, kTileRows, static_cast<int64_t>(k) * m, [&](int32_t o, int32_t r0) {
    const QuantOut& out = outs[o];
    const int32_t n = static_cast<int32_t>(out.w->rows), rows = std::min(kTileRows, n - r0);
    const uint8_t* w = static_cast<const uint8_t*>(out.w->blocks) + r0 / kTileRows * blocks * TileBlockBytes<K>();
    const float* bias = out.bias != nullptr ? out.bias + r0 : nullptr;
    for (int32_t i0 = 0; i0 < m; i0 += per) {
      const int32_t count = std::min(per, m - i0);
      kFns[count - 1](w, blocks, a, i0, bias, rows, n, out.y + static_cast<int64_t>(i0) * n + r0);
    }
  });
}
#endif  // SPECULA_QUANT_WIDTH

std::atomic<int> g_engine{-1};  // a TileEngine; -1: not chosen yet

}  // namespace

bool TileEngineAvailable(TileEngine e) {
#if SPECULA_QUANT_WIDTH == 512
  if (e == TileEngine::kAmx) return amx::Usable();
  return true;
#else
  return e == TileEngine::kVector;
#endif
}

bool SetTileEngine(TileEngine e) {
  if (!TileEngineAvailable(e)) return false;
  g_engine.store(static_cast<int>(e), std::memory_order_relaxed);
  return true;
}

bool AmxServes(int32_t rows) { return rows >= kAmxMinTokens && CurrentTileEngine() != TileEngine::kVector; }

TileEngine CurrentTileEngine() {
  int e = g_engine.load(std::memory_order_relaxed);
  if (e < 0) {
    e = static_cast<int>(TileEngineAvailable(TileEngine::kAmx) ? TileEngine::kAmx : TileEngine::kVector);
    g_engine.store(e, std::memory_order_relaxed);
  }
  return static_cast<TileEngine>(e);
}

std::vector<uint8_t> RepackTiles(const QuantMatrix& w) {
#if defined(SPECULA_QUANT_WIDTH)
  if (w.type == QuantType::kQ4_1) return Tiles<Q4_1Tile>(w);
  if (w.type == QuantType::kQ8_0) return Tiles<Q8_0Tile>(w);
#endif
  (void)w;
  return {};
}

void TileRow(const QuantMatrix& w, int64_t r, float* out) {
#if defined(SPECULA_QUANT_WIDTH)
  if (w.type == QuantType::kQ4_1) return TileRow<Q4_1Tile>(w, r, out);
  if (w.type == QuantType::kQ8_0) return TileRow<Q8_0Tile>(w, r, out);
#endif
  (void)w, (void)r, (void)out;
  std::abort();  // no tiles of this type in this build
}

void TileProducts(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs) {
#if defined(SPECULA_QUANT_WIDTH)
  if (outs[0].w->type == QuantType::kQ4_1) return TileProducts<Q4_1Tile>(x, m, k, outs, num_outs);
  if (outs[0].w->type == QuantType::kQ8_0) return TileProducts<Q8_0Tile>(x, m, k, outs, num_outs);
#endif
  (void)x, (void)m, (void)k, (void)outs, (void)num_outs;
  std::abort();  // no tiles of this type in this build
}

}  // namespace specula::cpu

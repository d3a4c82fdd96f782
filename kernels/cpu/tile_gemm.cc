// Q4_1 on row tiles (kernels/cpu/tile_gemm.h). The vector layer is kernels/cpu/quant_vec.h's.
#include "kernels/cpu/tile_gemm.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "core/quant.h"
#include "kernels/cpu/quant_vec.h"
#include "kernels/cpu/simd.h"

namespace specula::cpu {
namespace {

#if defined(SPECULA_QUANT_WIDTH)
constexpr int kRows = 4 * kV;              // rows per tile: one per 32-bit lane
constexpr int kVecBytes = 4 * kRows;       // a vector: 4 bytes of each row
constexpr int kNibbles = 4 * kVecBytes;    // a tile-block's nibble vectors; then kRows d, kRows m (f16)
constexpr int kTileBlock = kNibbles + 4 * kRows;  // = kRows 20-byte blocks
constexpr int kMaxOuts = 4;                // matrices in one pass, as LinearQuantMulti's
// Tokens per unpacking of a block: 16 accumulators fit AVX-512's 32 registers beside the block's 8
// and its scales (SmolLM2 Q4_1 on a Zen 5 EPYC, 16 tokens over 576 x 576: 16 in one pass 16.1 us,
// two of 8 17.8). AVX2's 16 registers hold 4.
constexpr int kMaxTokens = SPECULA_QUANT_WIDTH == 512 ? 16 : 8;
// The weights are prefetched this far ahead of the block being read (they stream from memory at one
// token; 8 KB, as the GGUF arrangement's rows).
constexpr int64_t kPrefetchBytes = 8192;

// The activations quantized per block of 32 (QuantizeGroup): values [blocks, m, 32], so that a
// block's tokens lie together at immediate offsets; their scales dx and dx * sum, [blocks, m].
struct TileActs {
  const int8_t* q;
  const float* dx;
  const float* sx;
  int32_t m;
};

TileActs QuantizeTileActs(const float* x, int32_t m, int32_t k) {
  const int64_t blocks = k / 32;
  const auto round64 = [](int64_t b) { return (b + 63) / 64 * 64; };
  const int64_t q_bytes = round64(static_cast<int64_t>(m) * k), f_bytes = round64(m * blocks * 4);
  thread_local std::vector<uint8_t> buf;  // the calling thread's, read by every thread of the call
  buf.resize(static_cast<size_t>(q_bytes + 2 * f_bytes + 64));
  uint8_t* base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  auto* q = reinterpret_cast<int8_t*>(base);
  auto* dx = reinterpret_cast<float*>(base + q_bytes);
  auto* sx = reinterpret_cast<float*>(base + q_bytes + f_bytes);
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(m) * k >= (1 << 16))
  for (int32_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t sum = 0;
      const int64_t at = b * m + i;
      dx[at] = QuantizeGroup<32>(x + static_cast<int64_t>(i) * k + 32 * b, q + 32 * at, &sum);
      sx[at] = dx[at] * static_cast<float>(sum);
    }
  }
  return TileActs{q, dx, sx, m};
}

// 4 activation bytes at p in every 32-bit lane.
inline IVec Bcast4(const int8_t* p) {
#if SPECULA_QUANT_WIDTH == 512
  return _mm512_maskz_broadcastd_epi32(0xFFFF, _mm_loadu_si32(p));
#else
  return _mm256_broadcastd_epi32(_mm_loadu_si32(p));
#endif
}

// Lane r: row r's integer dot product of a block (unpacked: lo[c], hi[c]) with a token's 32 values.
inline __attribute__((always_inline)) IVec BlockDot(const IVec lo[4], const IVec hi[4], const int8_t* x) {
#if SPECULA_QUANT_WIDTH == 512 && defined(__AVX512VNNI__)
  // Two chains of 4: half the latency of one of 8.
  IVec p0 = _mm512_dpbusd_epi32(ZeroI(), lo[0], Bcast4(x)), p1 = _mm512_dpbusd_epi32(ZeroI(), hi[0], Bcast4(x + 16));
  for (int c = 1; c < 4; ++c) {
    p0 = _mm512_dpbusd_epi32(p0, lo[c], Bcast4(x + 4 * c));
    p1 = _mm512_dpbusd_epi32(p1, hi[c], Bcast4(x + 16 + 4 * c));
  }
  return Add32(p0, p1);
#else
  // Each vpmaddubsw pair is below 2 * 15 * 127 in magnitude, and 8 of them below 2^15: one int16 sum.
  IVec s = Add16(Maddubs(lo[0], Bcast4(x)), Maddubs(hi[0], Bcast4(x + 16)));
  for (int c = 1; c < 4; ++c) s = Add16(s, Add16(Maddubs(lo[c], Bcast4(x + 4 * c)), Maddubs(hi[c], Bcast4(x + 16 + 4 * c))));
  return Madd1(s, ZeroI());
#endif
}

// y[i, r] (i < M, r < rows, y's rows ldy apart) = tile row r . token i0 + i + bias[r] (bias may be
// null): every block unpacked once for the M tokens, whose sums stay in registers.
template <int M>
void TileDot(const uint8_t* w, int64_t blocks, const TileActs& a, int32_t i0, const float* bias, int32_t rows,
             int64_t ldy, float* y) {
  FVec acc[M];
  for (int i = 0; i < M; ++i) acc[i] = ZeroF();
  for (int64_t b = 0; b < blocks; ++b, w += kTileBlock) {
    // (Past the matrix's end too: a thread's next tile follows, and a prefetch never faults.)
    for (int64_t o = 0; o < kTileBlock; o += 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(w) + kPrefetchBytes + o));
    }
    IVec lo[4], hi[4];
    for (int c = 0; c < 4; ++c) {
      const IVec v = LoadI(w + c * kVecBytes);
      lo[c] = And(v, Bytes(0x0F));
      hi[c] = And(Shr4(v), Bytes(0x0F));
    }
    const FVec d = HalvesToF(w + kNibbles), mn = HalvesToF(w + kNibbles + 2 * kRows);
    const int64_t at = b * a.m + i0;
    const int8_t* xq = a.q + 32 * at;
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) {
      acc[i] = FmaF(ToF(BlockDot(lo, hi, xq + 32 * i)), MulF(d, SetF(a.dx[at + i])), acc[i]);
      acc[i] = FmaF(mn, SetF(a.sx[at + i]), acc[i]);
    }
  }
  for (int i = 0; i < M; ++i) {
    const FVec v = bias != nullptr ? acc[i] + LoadFirst(bias, rows) : acc[i];
    SimdQ::StoreFirst(y + i * ldy, v, rows);
  }
}

template <int... I>
constexpr auto TileFns(std::integer_sequence<int, I...>) {
  using Fn = void (*)(const uint8_t*, int64_t, const TileActs&, int32_t, const float*, int32_t, int64_t, float*);
  return std::array<Fn, sizeof...(I)>{&TileDot<I + 1>...};
}
#endif  // SPECULA_QUANT_WIDTH

}  // namespace

int Q4_1TileRows() {
#if defined(SPECULA_QUANT_WIDTH)
  return kRows;
#else
  return 0;
#endif
}

std::vector<uint8_t> Q4_1Tiles(const QuantMatrix& w) {
#if defined(SPECULA_QUANT_WIDTH)
  const int64_t blocks = w.cols / 32, tiles = (w.rows + kRows - 1) / kRows;
  std::vector<uint8_t> out(static_cast<size_t>(tiles * blocks * kTileBlock), 0);
  const auto* src = static_cast<const BlockQ4_1*>(w.blocks);
  for (int64_t r = 0; r < w.rows; ++r) {
    const int lane = static_cast<int>(r % kRows);
    for (int64_t b = 0; b < blocks; ++b) {
      const BlockQ4_1& blk = src[r * blocks + b];
      uint8_t* t = &out[static_cast<size_t>((r / kRows * blocks + b) * kTileBlock)];
      for (int c = 0; c < 4; ++c) std::memcpy(t + c * kVecBytes + 4 * lane, blk.qs + 4 * c, 4);
      std::memcpy(t + kNibbles + 2 * lane, &blk.d, 2);
      std::memcpy(t + kNibbles + 2 * kRows + 2 * lane, &blk.m, 2);
    }
  }
  return out;
#else
  (void)w;
  return {};
#endif
}

void Q4_1TileRow(const QuantMatrix& w, int64_t r, float* out) {
#if defined(SPECULA_QUANT_WIDTH)
  const int64_t blocks = w.cols / 32;
  thread_local std::vector<BlockQ4_1> row;  // [blocks]: the row in GGUF's arrangement
  row.resize(static_cast<size_t>(blocks));
  const int lane = static_cast<int>(r % kRows);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t = static_cast<const uint8_t*>(w.blocks) + (r / kRows * blocks + b) * kTileBlock;
    for (int c = 0; c < 4; ++c) std::memcpy(row[b].qs + 4 * c, t + c * kVecBytes + 4 * lane, 4);
    std::memcpy(&row[b].d, t + kNibbles + 2 * lane, 2);
    std::memcpy(&row[b].m, t + kNibbles + 2 * kRows + 2 * lane, 2);
  }
  DequantizeRow(QuantType::kQ4_1, row.data(), w.cols, out);
#else
  (void)w, (void)r, (void)out;
  std::abort();  // no tiles in this build
#endif
}

void Q4_1TileProducts(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs) {
#if defined(SPECULA_QUANT_WIDTH)
  static constexpr auto kFns = TileFns(std::make_integer_sequence<int, kMaxTokens>());
  const TileActs a = QuantizeTileActs(x, m, k);
  const int64_t blocks = k / 32;
  int32_t first_tile[kMaxOuts + 1] = {0};  // output o's tiles: [first_tile[o], first_tile[o + 1])
  int64_t size = 0;
  for (int32_t o = 0; o < num_outs; ++o) {
    const int64_t n = outs[o].w->rows;
    first_tile[o + 1] = first_tile[o] + static_cast<int32_t>((n + kRows - 1) / kRows);
    size += n * k * m;
  }
  // Passes of equal size (18 tokens as 9 + 9, not 16 + 2).
  const int32_t passes = (m + kMaxTokens - 1) / kMaxTokens, per = (m + passes - 1) / passes;
#pragma omp parallel for schedule(static) if (size >= (1 << 16))
  for (int32_t tile = 0; tile < first_tile[num_outs]; ++tile) {
    int32_t o = 0;
    while (tile >= first_tile[o + 1]) ++o;
    const QuantOut& out = outs[o];
    const int32_t n = static_cast<int32_t>(out.w->rows), t = tile - first_tile[o], r0 = t * kRows;
    const int32_t rows = std::min(kRows, n - r0);
    const uint8_t* w = static_cast<const uint8_t*>(out.w->blocks) + t * blocks * kTileBlock;
    const float* bias = out.bias != nullptr ? out.bias + r0 : nullptr;
    for (int32_t i0 = 0; i0 < m; i0 += per) {
      const int32_t count = std::min(per, m - i0);
      kFns[count - 1](w, blocks, a, i0, bias, rows, n, out.y + static_cast<int64_t>(i0) * n + r0);
    }
  }
#else
  (void)x, (void)m, (void)k, (void)outs, (void)num_outs;
  std::abort();  // no tiles in this build
#endif
}

}  // namespace specula::cpu

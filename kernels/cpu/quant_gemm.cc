// How a quantized product runs. Q4_0, Q4_1, Q8_0, Q4_K and Q6_K multiply int8 activations where the
// build has integer vectors (AVX2, or AVX-512 BW): kernels/cpu/quant_units.cc on GGUF's blocks, or
// kernels/cpu/tile_gemm.cc on the row tiles of Q4_1 and Q8_0 matrices repacked for products.
//
// F16 and BF16 go through the float path (StreamGemm's tiles, weights converted in registers).
// Without AVX2 every type is dequantized a row at a time and multiplied in float (GemmDequant).
#include "kernels/cpu/quant_gemm.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/quant_units.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/stream_gemm.h"
#include "kernels/cpu/tile_gemm.h"

namespace specula::cpu {
namespace {

// --- F16 and BF16: the float row-major path, weights converted in registers ----------------------
// StreamGemm's tiles load weights through VLoadW, found for these element types by argument-dependent
// lookup; the scalar multiply serves its non-SIMD build.
struct F16W {
  uint16_t bits;
};
struct Bf16W {
  uint16_t bits;
};
inline float operator*(F16W w, float x) { return F16ToF32(w.bits) * x; }
inline float operator*(Bf16W w, float x) { return Bf16ToF32(w.bits) * x; }
#if defined(__AVX512F__)
inline Vec VLoadW(const F16W* p) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Vec VLoadW(const Bf16W* p) { return Simd16::Load(reinterpret_cast<const Bf16*>(p)); }
#elif defined(SPECULA_AVX2)
inline Vec VLoadW(const F16W* p) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float t[8];
  for (int i = 0; i < 8; ++i) t[i] = F16ToF32(p[i].bits);
  return _mm256_load_ps(t);
#endif
}
inline Vec VLoadW(const Bf16W* p) { return Simd8::Load(reinterpret_cast<const Bf16*>(p)); }
#endif

// One token: StreamGemm's tiles of rows (DotTile's sums, the same bits as for more tokens) with a
// software prefetch of the rows 8 KB ahead, as for the quantized rows (kPrefetchBytes, quant_units.cc):
// without it an F16 matrix came from memory at half the read bandwidth.
template <typename W>
void GemvFloat(const float* x, const W* w, const float* bias, int32_t n, int32_t k, float* y) {
  constexpr int32_t kR = TileRows<1>();
  constexpr int64_t kAhead = 8192 / sizeof(W);
  const int64_t size = static_cast<int64_t>(n) * k;
#pragma omp parallel for schedule(static) if (size >= (1 << 16))
  for (int32_t r0 = 0; r0 < n; r0 += kR) {
    const W* rows = w + static_cast<int64_t>(r0) * k;
    const int32_t count = std::min(kR, n - r0);
    if ((r0 + count) * static_cast<int64_t>(k) + kAhead <= size) {
      for (int64_t o = 0; o < count * static_cast<int64_t>(k); o += 64 / static_cast<int64_t>(sizeof(W))) {
        __builtin_prefetch(rows + kAhead + o);
      }
    }
    float out[kR][1];
    if (count == kR) {
      DotTile<1, kR>(rows, x, k, out);
    } else {
      for (int32_t r = 0; r < count; ++r) DotTile<1, 1>(rows + static_cast<int64_t>(r) * k, x, k, &out[r]);
    }
    for (int32_t r = 0; r < count; ++r) y[r0 + r] = out[r][0] + (bias != nullptr ? bias[r0 + r] : 0.0f);
  }
}

// Without AVX2 (or with AVX-512F but neither BW nor AVX2): each row dequantized to float, exact
// float activations.
[[maybe_unused]] void GemmDequant(const float* x, const QuantMatrix& w, const float* bias, int32_t m, int32_t n,
                                  int32_t k, float* y) {
  const int64_t row_bytes = QuantRowBytes(w.type, k);
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(n) * k * m >= (1 << 16))
  for (int32_t r = 0; r < n; ++r) {
    thread_local std::vector<float> row;  // [k]
    row.resize(static_cast<size_t>(k));
    DequantizeRow(w.type, static_cast<const uint8_t*>(w.blocks) + r * row_bytes, k, row.data());
    for (int32_t i = 0; i < m; ++i) {
      y[static_cast<int64_t>(i) * n + r] =
          Dot(x + static_cast<int64_t>(i) * k, row.data(), k) + (bias != nullptr ? bias[r] : 0.0f);
    }
  }
}

}  // namespace

void LinearQuant(const float* x, const QuantMatrix& w, const float* bias, int32_t m, int32_t n, int32_t k, float* y) {
  switch (w.type) {
    case QuantType::kF32:
      return StreamGemm(x, m, k, static_cast<const float*>(w.blocks), nullptr, n, y, bias);
    case QuantType::kF16:
      if (m == 1) return GemvFloat(x, static_cast<const F16W*>(w.blocks), bias, n, k, y);
      return StreamGemm(x, m, k, static_cast<const F16W*>(w.blocks), nullptr, n, y, bias);
    case QuantType::kBF16:
      if (m == 1) return GemvFloat(x, static_cast<const Bf16W*>(w.blocks), bias, n, k, y);
      return StreamGemm(x, m, k, static_cast<const Bf16W*>(w.blocks), nullptr, n, y, bias);
    default: break;
  }
  const QuantOut out{&w, bias, y};
  if (!IntegerProducts(x, m, k, &out, 1)) GemmDequant(x, w, bias, m, n, k, y);
}

void LinearQuantMulti(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs) {
  bool shared = num_outs <= kMaxQuantOuts;
  for (int32_t i = 1; i < num_outs; ++i) {
    shared = shared && outs[i].w->type == outs[0].w->type &&
             outs[i].w->two_term_activations == outs[0].w->two_term_activations &&
             outs[i].w->repacked == outs[0].w->repacked;
  }
  if (shared && IntegerProducts(x, m, k, outs, num_outs)) return;
  for (int32_t i = 0; i < num_outs; ++i) {
    LinearQuant(x, *outs[i].w, outs[i].bias, m, static_cast<int32_t>(outs[i].w->rows), k, outs[i].y);
  }
}

std::vector<uint8_t> RepackForProducts(const QuantMatrix& w) {
  if (w.repacked) return {};
  return RepackTiles(w);
}

void QuantRow(const QuantMatrix& w, int64_t r, float* out) {
  if (w.repacked) return TileRow(w, r, out);
  DequantizeRow(w.type, static_cast<const uint8_t*>(w.blocks) + r * QuantRowBytes(w.type, w.cols), w.cols, out);
}

}  // namespace specula::cpu

// GGUF tensor element types and their block layouts (as llama.cpp's ggml defines them), with the
// scalar reference conversions. Quantized weights stay in these blocks in memory; the CPU kernels
// (kernels/cpu/quant_gemm.h) compute on them. The scalar code here is the reference: its
// dequantization agrees bit for bit with the `gguf` Python package (tests/model/gguf_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specula {

// Values are the GGUF file's type ids.
enum class QuantType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kQ8_1 = 9,  // activations only (never a weight type here)
  kQ4_K = 12,
  kQ6_K = 14,
  kBF16 = 30,
};

constexpr int kQK = 32;    // values per block of the simple types (Q4_0, Q4_1, Q8_0, Q8_1)
constexpr int kQKK = 256;  // values per super-block of the K types (Q4_K, Q6_K)

// x[j] = d * (q[j] - 8); q[j] = qs[j] & 15 for j < 16, qs[j - 16] >> 4 for j >= 16.
struct BlockQ4_0 {
  uint16_t d;  // f16
  uint8_t qs[kQK / 2];
};
// x[j] = d * q[j] + m, with q as in Q4_0.
struct BlockQ4_1 {
  uint16_t d, m;  // f16
  uint8_t qs[kQK / 2];
};
// x[j] = d * qs[j].
struct BlockQ8_0 {
  uint16_t d;  // f16
  int8_t qs[kQK];
};
// Activations: x[j] ~= d * qs[j]; s = d * sum(qs) (lets Q4_1's offset m fold into one multiply).
struct BlockQ8_1 {
  uint16_t d, s;  // f16
  int8_t qs[kQK];
};
// 8 sub-blocks of 32 with 6-bit scales and mins: x = d * sc[i] * q - dmin * mn[i], q in 0..15.
struct BlockQ4_K {
  uint16_t d, dmin;   // f16
  uint8_t scales[12]; // sc[8] and mn[8], 6 bits each (see Q4KScaleMin)
  uint8_t qs[kQKK / 2];
};
// 16 sub-blocks of 16 with int8 scales: x = d * scales[i] * (q - 32), q in 0..63 (4 low bits in
// ql, 2 high bits in qh).
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;  // f16
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34 &&
              sizeof(BlockQ8_1) == 36 && sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210);

// False for a type id this build does not read.
bool IsSupportedQuantType(uint32_t type);
const char* QuantTypeName(QuantType t);
// "q4_0", "Q8_0", "f16", ... -> type; InvalidArgument naming the value otherwise.
absl::StatusOr<QuantType> ParseQuantType(absl::string_view name);
// Values per block (1 for F32/F16/BF16) and bytes per block.
int64_t QuantBlockSize(QuantType t);
int64_t QuantBlockBytes(QuantType t);
// Bytes of one row of `n` values; n must be a multiple of the block size.
inline int64_t QuantRowBytes(QuantType t, int64_t n) { return n / QuantBlockSize(t) * QuantBlockBytes(t); }

// Q4_K's packed 6-bit scale and min of sub-block j (0..7).
inline void Q4KScaleMin(int j, const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// y[n] = the values of `n` consecutive elements of type `t` at `src` (n a multiple of the block
// size). Matches gguf-py's numpy arithmetic bit for bit (no fused multiply-adds).
void DequantizeRow(QuantType t, const void* src, int64_t n, float* y);

// Reference quantizers (llama.cpp's rounding): n a multiple of 32. Used to requantize a model
// (self-quant drafts, Q8_0 files) and by the kernels' tests.
void QuantizeRowQ8_0(const float* x, int64_t n, BlockQ8_0* out);
void QuantizeRowQ8_1(const float* x, int64_t n, BlockQ8_1* out);
void QuantizeRowQ4_0(const float* x, int64_t n, BlockQ4_0* out);
void QuantizeRowQ4_1(const float* x, int64_t n, BlockQ4_1* out);

}  // namespace specula

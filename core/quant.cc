// Compiled with -ffp-contract=off (core/CMakeLists.txt): gguf-py computes d * q + m as two
// rounded float32 operations, and a fused multiply-add would differ in the last bit.
#include "core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/dtype.h"

namespace specula {

bool IsSupportedQuantType(uint32_t type) {
  switch (static_cast<QuantType>(type)) {
    case QuantType::kF32:
    case QuantType::kF16:
    case QuantType::kBF16:
    case QuantType::kQ4_0:
    case QuantType::kQ4_1:
    case QuantType::kQ8_0:
    case QuantType::kQ4_K:
    case QuantType::kQ6_K: return true;
    default: return false;
  }
}

const char* QuantTypeName(QuantType t) {
  switch (t) {
    case QuantType::kF32: return "F32";
    case QuantType::kF16: return "F16";
    case QuantType::kBF16: return "BF16";
    case QuantType::kQ4_0: return "Q4_0";
    case QuantType::kQ4_1: return "Q4_1";
    case QuantType::kQ8_0: return "Q8_0";
    case QuantType::kQ8_1: return "Q8_1";
    case QuantType::kQ4_K: return "Q4_K";
    case QuantType::kQ6_K: return "Q6_K";
  }
  return "?";
}

absl::StatusOr<QuantType> ParseQuantType(absl::string_view name) {
  const std::string up = absl::AsciiStrToUpper(name);
  for (QuantType t : {QuantType::kF32, QuantType::kF16, QuantType::kBF16, QuantType::kQ4_0, QuantType::kQ4_1,
                      QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ6_K}) {
    if (up == QuantTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown quantization type '", name, "' (expected f32, f16, bf16, q8_0, q4_0, q4_1, q4_k or q6_k)"));
}

int64_t QuantBlockSize(QuantType t) {
  switch (t) {
    case QuantType::kF32:
    case QuantType::kF16:
    case QuantType::kBF16: return 1;
    case QuantType::kQ4_K:
    case QuantType::kQ6_K: return kQKK;
    default: return kQK;
  }
}

int64_t QuantBlockBytes(QuantType t) {
  switch (t) {
    case QuantType::kF32: return 4;
    case QuantType::kF16:
    case QuantType::kBF16: return 2;
    case QuantType::kQ4_0: return sizeof(BlockQ4_0);
    case QuantType::kQ4_1: return sizeof(BlockQ4_1);
    case QuantType::kQ8_0: return sizeof(BlockQ8_0);
    case QuantType::kQ8_1: return sizeof(BlockQ8_1);
    case QuantType::kQ4_K: return sizeof(BlockQ4_K);
    case QuantType::kQ6_K: return sizeof(BlockQ6_K);
  }
  return 0;
}

namespace {

// Blocks are read with memcpy: a tensor's data in a mapped GGUF file is only 32-byte aligned as a
// whole, and the 18/20/34-byte blocks leave their f16 fields unaligned.
template <typename B>
B LoadBlock(const void* src, int64_t i) {
  B b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + i * static_cast<int64_t>(sizeof(B)), sizeof(B));
  return b;
}

void DequantQ4_0(const void* src, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = LoadBlock<BlockQ4_0>(src, i);
    const float d = F16ToF32(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0xF) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantQ4_1(const void* src, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = LoadBlock<BlockQ4_1>(src, i);
    const float d = F16ToF32(b.d), m = F16ToF32(b.m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(b.qs[j] & 0xF) + m;
      y[j + kQK / 2] = d * static_cast<float>(b.qs[j] >> 4) + m;
    }
  }
}

void DequantQ8_0(const void* src, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = LoadBlock<BlockQ8_0>(src, i);
    const float d = F16ToF32(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(b.qs[j]);
  }
}

void DequantQ4_K(const void* src, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ4_K>(src, i);
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    const uint8_t* q = b.qs;
    for (int j = 0; j < kQKK / 64; ++j, q += 32) {  // 64 values: two sub-blocks share 32 bytes
      uint8_t sc, mn;
      Q4KScaleMin(2 * j, b.scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      Q4KScaleMin(2 * j + 1, b.scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void DequantQ6_K(const void* src, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ6_K>(src, i);
    const float d = F16ToF32(b.d);
    const uint8_t *ql = b.ql, *qh = b.qh;
    const int8_t* sc = b.scales;
    for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = (d * static_cast<float>(sc[is + 0])) * static_cast<float>(q1);
        y[l + 32] = (d * static_cast<float>(sc[is + 2])) * static_cast<float>(q2);
        y[l + 64] = (d * static_cast<float>(sc[is + 4])) * static_cast<float>(q3);
        y[l + 96] = (d * static_cast<float>(sc[is + 6])) * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

void DequantizeRow(QuantType t, const void* src, int64_t n, float* y) {
  const int64_t nb = n / QuantBlockSize(t);
  const auto* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case QuantType::kF32: std::memcpy(y, src, static_cast<size_t>(n) * 4); return;
    case QuantType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        y[i] = F16ToF32(h);
      }
      return;
    case QuantType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        y[i] = Bf16ToF32(h);
      }
      return;
    case QuantType::kQ4_0: return DequantQ4_0(src, nb, y);
    case QuantType::kQ4_1: return DequantQ4_1(src, nb, y);
    case QuantType::kQ8_0: return DequantQ8_0(src, nb, y);
    case QuantType::kQ8_1:
      for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const auto b = LoadBlock<BlockQ8_1>(src, i);
        const float d = F16ToF32(b.d);
        for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(b.qs[j]);
      }
      return;
    case QuantType::kQ4_K: return DequantQ4_K(src, nb, y);
    case QuantType::kQ6_K: return DequantQ6_K(src, nb, y);
  }
}

// The quantizers follow llama.cpp's reference rounding (round half away from zero).
void QuantizeRowQ8_0(const float* x, int64_t n, BlockQ8_0* out) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    out[i].d = F32ToF16(d);
    for (int j = 0; j < kQK; ++j) out[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void QuantizeRowQ8_1(const float* x, int64_t n, BlockQ8_1* out) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      out[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
      sum += out[i].qs[j];
    }
    out[i].d = F32ToF16(d);
    out[i].s = F32ToF16(d * static_cast<float>(sum));
  }
}

void QuantizeRowQ4_0(const float* x, int64_t n, BlockQ4_0* out) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, with its sign
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    out[i].d = F32ToF16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(x[j + kQK / 2] * id + 8.5f));
      out[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeRowQ4_1(const float* x, int64_t n, BlockQ4_1* out) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQK; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
    }
    const float d = (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    out[i].d = F32ToF16(d);
    out[i].m = F32ToF16(lo);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>((x[j] - lo) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((x[j + kQK / 2] - lo) * id + 0.5f));
      out[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

}  // namespace specula

// Element types of weights, activations and KV, and the scalar conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace specula {

enum class DType : uint8_t { kF32, kF16, kBF16 };

inline size_t DTypeBytes(DType t) { return t == DType::kF32 ? 4 : 2; }
inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}
inline absl::StatusOr<DType> ParseDType(absl::string_view s) {
  if (s == "f32" || s == "float32") return DType::kF32;
  if (s == "f16" || s == "float16") return DType::kF16;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", s, "' (expected f32, f16 or bf16)"));
}

float Bf16ToF32(uint16_t h);
uint16_t F32ToBf16(float f);  // round to nearest even
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);   // round to nearest even

}  // namespace specula

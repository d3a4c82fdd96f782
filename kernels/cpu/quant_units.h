// The integer products of the quantized matrices (kernels/cpu/quant_units.cc), for LinearQuant and
// LinearQuantMulti (kernels/cpu/quant_gemm.cc).
#pragma once

#include <cstdint>

#include "kernels/cpu/quant_gemm.h"

namespace specula::cpu {

// Matrices in one LinearQuantMulti pass, at most.
inline constexpr int kMaxQuantOuts = 4;

// outs[i].y = x w_i^T + bias_i for outputs that share a type and activations (outs[0]'s), through
// the integer kernels; false, with nothing computed, where the type has none (F16, BF16, or a build
// without integer vectors).
bool IntegerProducts(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs);

}  // namespace specula::cpu

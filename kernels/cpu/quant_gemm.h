// Matrix products on GGUF quantized blocks (core/quant.h) where they lie, or for Q4_1 and Q8_0 in
// an arrangement of their own (RepackForProducts): weights are never converted to float. Q4_0, Q4_1, Q8_0,
// Q4_K and Q6_K multiply int8 activations (each row of x quantized once per call, per group of 32
// values, 16 for Q6_K); F16 and BF16 convert the weights in registers and multiply float
// activations.
//
// A token's outputs are the same bits whatever the number of tokens in the call (m) and the number
// of threads: each output element is one fixed sequence of operations on that token's row and one
// weight row (tests/kernels/quant_gemm_test.cc checks it).
#pragma once

#include <cstdint>
#include <vector>

#include "core/quant.h"

namespace specula::cpu {

// A weight matrix in GGUF blocks. Rows need no alignment (a mapped file gives 32 bytes for the
// tensor's start only; the 18- and 34-byte blocks leave the rows after it at any address).
struct QuantMatrix {
  const void* blocks = nullptr;  // [rows, cols / block size] blocks of `type`, row-major
  QuantType type = QuantType::kQ8_0;
  int64_t rows = 0, cols = 0;
  // Activations as two 8-bit terms (x = hi + lo, each quantized per group): float-like accuracy at
  // twice the integer work, in the same pass over the weights. false: one 8-bit term, as
  // llama.cpp (CpuOptions::int8_activations).
  bool two_term_activations = true;
  // `blocks` holds RepackForProducts' arrangement instead of GGUF's.
  bool repacked = false;
};

// A copy of w's blocks (GGUF's arrangement) in the one the products read fastest, or empty where
// there is none (types other than Q4_1 and Q8_0, builds without AVX2): row tiles
// (kernels/cpu/tile_gemm.h), whose products sum the same integer dot products as GGUF's arrangement
// in another order, so they give its values to float rounding, not its bits. QuantRow gives the
// same bits on either arrangement.
std::vector<uint8_t> RepackForProducts(const QuantMatrix& w);

// y[m, n] = x[m, k] dequant(w)[n, k]^T + bias[n] (bias may be null); k == w.cols (a multiple of
// the block size: 32, 256 for Q4_K and Q6_K), n == w.rows.
void LinearQuant(const float* x, const QuantMatrix& w, const float* bias, int32_t m, int32_t n, int32_t k, float* y);

// One product of several matrices with the same input (Q, K and V; gate and up).
struct QuantOut {
  const QuantMatrix* w;
  const float* bias;  // [w->rows] or null
  float* y;           // [m, w->rows]
};
// outs[i].y = x w_i^T + bias_i for each i, the same bits as LinearQuant for each. Where every matrix
// has the same type and activations, x is quantized once and all the rows go through one parallel
// loop (one fork and join instead of one per matrix); otherwise one LinearQuant each.
void LinearQuantMulti(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs);

// out[cols] = dequant(w)[r, :] (embedding lookup): DequantizeRow's values, bit for bit.
void QuantRow(const QuantMatrix& w, int64_t r, float* out);

}  // namespace specula::cpu

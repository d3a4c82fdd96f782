// Weight-only int8 matrices of the CPU backend (--quantization / --draft-quantization int8): one
// float scale per row, symmetric (max |w| / 127). A quarter of float32's bytes per decode step.
#pragma once

#include <cstdint>
#include <vector>

namespace specula::cpu {

// A weight matrix stored as int8 rows with one scale each: w[r, j] ~= q[r, j] * scale[r].
struct Q8Matrix {
  std::vector<int8_t> q;     // [rows, cols]
  std::vector<float> scale;  // [rows]
  std::vector<int32_t> row_sum;  // [rows]: sum of q over the row (the VNNI path's offset correction)
  int64_t rows = 0, cols = 0;
};

Q8Matrix Quantize(const float* w, int64_t rows, int64_t cols);

// y[m, n] = x[m, k] dequant(w)[n, k]^T + bias[n] (bias may be null).
void LinearQ8(const float* x, const Q8Matrix& w, const float* bias, int32_t m, int32_t n, int32_t k, float* y);

}  // namespace specula::cpu

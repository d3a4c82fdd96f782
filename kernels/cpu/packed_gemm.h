// The CPU backend's float32 GEMM on weights packed once at upload: w[n, k] is stored as
// [ceil(n / 64)][k][64], so each thread reads its weights as one sequential stream (what the
// prefetcher follows best) and a register tile of up to 6 tokens x 64 rows broadcasts the
// activations instead of reducing dot products horizontally. (Groups of 16 rows, tried for a
// finer split of small matrices, read a 1B model's weights 40% slower at one token.) It replaces OpenBLAS's sgemm, which re-packed the whole
// weight matrix on every call (a sixth of a batched decode step), and the row-interleaved tiles
// that ran verification passes at half the memory bandwidth.
#pragma once

#include <cstdint>
#include <memory>

namespace specula::cpu {

// True where the packed kernel is compiled in (AVX-512); elsewhere weights stay row-major.
bool PackedGemmAvailable();

class PackedMatrix {
 public:
  static constexpr int32_t kGroup = 64;  // rows per packed group

  PackedMatrix(const float* w, int64_t rows, int64_t cols);  // w[rows, cols], row-major
  const float* data() const { return data_.get(); }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // The row-major original, kept for single-token products of small matrices (see PackedGemm).
  const float* row_major() const { return row_major_; }
  // w[r, j] for j in [0, cols) into out[cols].
  void Row(int64_t r, float* out) const;

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, Free> data_;  // [groups, cols, kGroup], rows past `rows` are zero
  const float* row_major_;  // not owned: the weights outlive the backend's use of them
  int64_t rows_, cols_;
};

// y[m, n] = x[m, k] w[n, k]^T + bias[n] (bias may be null), n and k those of w.
void PackedGemm(const float* x, int32_t m, const PackedMatrix& w, const float* bias, float* y);

}  // namespace specula::cpu

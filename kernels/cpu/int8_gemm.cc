#include "kernels/cpu/int8_gemm.h"


#include <algorithm>
#include <cmath>

#include "kernels/cpu/stream_gemm.h"

namespace specula::cpu {

Q8Matrix Quantize(const float* w, int64_t rows, int64_t cols) {
  Q8Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.q.resize(static_cast<size_t>(rows * cols));
  m.scale.resize(static_cast<size_t>(rows));
  m.row_sum.assign(static_cast<size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    float amax = 0.0f;
    for (int64_t j = 0; j < cols; ++j) amax = std::max(amax, std::fabs(row[j]));
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    for (int64_t j = 0; j < cols; ++j) {
      m.q[r * cols + j] = static_cast<int8_t>(std::lrint(row[j] / scale));
      m.row_sum[r] += m.q[r * cols + j];
    }
    m.scale[r] = scale;
  }
  return m;
}

namespace {


#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// With VNNI the activations are quantized too (per token, symmetric, stored offset by 128 as u8
// for vpdpbusd), so one instruction does 64 multiply-adds: the float widening path was
// compute-bound at half the memory bandwidth. y = sw[r] sx[i] (sum_j (xq + 128) q - 128 rowsum).
template <int M>
void GemmQ8VnniM(const uint8_t* xq, const float* sx, int32_t k, const Q8Matrix& w, const float* bias, int32_t n,
                 float* y) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(n) * k >= (1 << 11))
  for (int32_t r = 0; r < n; ++r) {
    const int8_t* q = w.q.data() + static_cast<int64_t>(r) * k;
    __m512i acc[M];
    for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_si512();
    int32_t j = 0;
    for (; j + 64 <= k; j += 64) {
      const __m512i wv = _mm512_loadu_si512(q + j);
      for (int i = 0; i < M; ++i) {
        acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_loadu_si512(xq + static_cast<int64_t>(i) * k + j), wv);
      }
    }
    for (int i = 0; i < M; ++i) {
      alignas(64) int32_t lanes[16];
      _mm512_store_si512(lanes, acc[i]);
      int32_t t = 0;
      for (int l = 0; l < 16; ++l) t += lanes[l];
      for (int32_t jj = j; jj < k; ++jj) t += static_cast<int32_t>(xq[static_cast<int64_t>(i) * k + jj]) * q[jj];
      y[static_cast<int64_t>(i) * n + r] = w.scale[r] * sx[i] * static_cast<float>(t - 128 * w.row_sum[r]) +
                                           (bias != nullptr ? bias[r] : 0.0f);
    }
  }
}

void GemmQ8Vnni(const float* x, const Q8Matrix& w, const float* bias, int32_t m, int32_t n, int32_t k, float* y) {
  thread_local std::vector<uint8_t> xq;  // [m, k]
  float sx[kStreamMaxRows];
  xq.resize(static_cast<size_t>(m) * k);
  for (int32_t i = 0; i < m; ++i) {
    const float* xi = x + static_cast<int64_t>(i) * k;
    float amax = 0.0f;
    for (int32_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(xi[j]));
    sx[i] = amax > 0.0f ? amax / 127.0f : 1.0f;
    const float inv = 1.0f / sx[i];
    uint8_t* qi = xq.data() + static_cast<int64_t>(i) * k;
    for (int32_t j = 0; j < k; ++j) qi[j] = static_cast<uint8_t>(std::lrint(xi[j] * inv) + 128);
  }
  switch (m) {
    case 1: return GemmQ8VnniM<1>(xq.data(), sx, k, w, bias, n, y);
    case 2: return GemmQ8VnniM<2>(xq.data(), sx, k, w, bias, n, y);
    case 3: return GemmQ8VnniM<3>(xq.data(), sx, k, w, bias, n, y);
    case 4: return GemmQ8VnniM<4>(xq.data(), sx, k, w, bias, n, y);
    case 5: return GemmQ8VnniM<5>(xq.data(), sx, k, w, bias, n, y);
    case 6: return GemmQ8VnniM<6>(xq.data(), sx, k, w, bias, n, y);
    case 7: return GemmQ8VnniM<7>(xq.data(), sx, k, w, bias, n, y);
    default: return GemmQ8VnniM<8>(xq.data(), sx, k, w, bias, n, y);
  }
}
#endif

// y[n] = dequant(w)[n, k] x[k] + bias[n], one row at a time: a single sequential stream per thread
// is what the prefetcher follows best (4 interleaved int8 rows ran at 14 GB/s, one at twice that).
void GemvQ8(const float* x, const Q8Matrix& w, const float* bias, int32_t n, int32_t k, float* y) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(n) * k >= (1 << 11))
  for (int32_t r = 0; r < n; ++r) {
    const int8_t* q = w.q.data() + static_cast<int64_t>(r) * k;
    float t = 0.0f;
    int32_t j = 0;
#if defined(__AVX512F__) || defined(SPECULA_AVX2)
    Vec c0 = VZero(), c1 = c0, c2 = c0, c3 = c0;
    for (; j + 4 * kLanes <= k; j += 4 * kLanes) {
      c0 = VFma(VLoadW(q + j), VLoad(x + j), c0);
      c1 = VFma(VLoadW(q + j + kLanes), VLoad(x + j + kLanes), c1);
      c2 = VFma(VLoadW(q + j + 2 * kLanes), VLoad(x + j + 2 * kLanes), c2);
      c3 = VFma(VLoadW(q + j + 3 * kLanes), VLoad(x + j + 3 * kLanes), c3);
    }
    for (; j + kLanes <= k; j += kLanes) c0 = VFma(VLoadW(q + j), VLoad(x + j), c0);
    t = VSum(c0) + VSum(c1) + VSum(c2) + VSum(c3);
#endif
    for (; j < k; ++j) t += q[j] * x[j];
    y[r] = t * w.scale[r] + (bias != nullptr ? bias[r] : 0.0f);
  }
}

}  // namespace

// y[m, n] = x[m, k] dequant(w)[n, k]^T + bias[n]. With VNNI, up to 8 tokens quantize their
// activations too (one instruction does 64 multiply-adds); otherwise, and for more tokens, the
// int8 rows are widened in registers by the row-major tiles, 8 tokens per pass over them.
void LinearQ8(const float* x, const Q8Matrix& w, const float* bias, int32_t m, int32_t n, int32_t k, float* y) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (m <= kStreamMaxRows) return GemmQ8Vnni(x, w, bias, m, n, k, y);
#endif
  if (m == 1) return GemvQ8(x, w, bias, n, k, y);
  StreamGemm(x, m, k, w.q.data(), w.scale.data(), n, y, bias);
}

}  // namespace specula::cpu

#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace specula {
namespace {

// y[n] = w[n, k] x[k]. Single-token decode is memory-bound: rows are split across threads and
// each dot product is SIMD-reduced. (OpenBLAS sgemv measured 2.4x slower than this on the CI
// machine's AMD EPYC, single-threaded; see bench/decode_bench.cc.)
// exp(x) for x in [-87, 88] with relative error ~2e-7, written branch-free so that `omp simd` loops
// vectorize it (libm's expf does not vectorize without -ffast-math): 2^(x log2 e) split into an
// integer power, built in the exponent bits, and 2^f for f in [-0.5, 0.5] by its Taylor series.
#pragma omp declare simd
inline float ExpApprox(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float t = x * 1.4426950409f;
  const float n = std::nearbyint(t);
  const float f = (t - n) * 0.6931471806f;  // e^f = 2^(t - n)
  float p = 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

#if defined(__AVX2__) && defined(__FMA__)
inline __attribute__((always_inline)) float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Four accumulators along k hide the FMA latency; rows stay one sequential stream, which the
// hardware prefetcher follows best (measured: 4-row blocking halves the bandwidth here).
inline __attribute__((always_inline)) float Dot(const float* a, const float* b, int32_t k) {
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
  int32_t j = 0;
  for (; j + 32 <= k; j += 32) {
    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), c0);
    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), c1);
    c2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 16), _mm256_loadu_ps(b + j + 16), c2);
    c3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 24), _mm256_loadu_ps(b + j + 24), c3);
  }
  for (; j + 8 <= k; j += 8) c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), c0);
  float t = HorizontalSum(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
  for (; j < k; ++j) t += a[j] * b[j];
  return t;
}
#else
inline float Dot(const float* a, const float* b, int32_t k) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int32_t j = 0; j < k; ++j) acc += a[j] * b[j];
  return acc;
}
#endif

// y[n] = w[n, k] x[k]. Single-token decode is memory-bound; rows are split across threads.
// (OpenBLAS sgemv measured 2.4x slower than this on the CI machine's AMD EPYC, single-threaded.)
void Gemv(const float* x, const float* w, int32_t n, int32_t k, float* y) {
  const bool parallel = static_cast<int64_t>(n) * k >= (1 << 11);
#pragma omp parallel for schedule(static) if (parallel)
  for (int32_t i = 0; i < n; ++i) y[i] = Dot(w + static_cast<int64_t>(i) * k, x, k);
}

class CpuBackend final : public Backend {
 public:
  void Linear(const float* x, const float* w, const float* bias, int32_t m, int32_t n, int32_t k,
              float* y) override {
    if (m == 1) {
      Gemv(x, w, n, k, y);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
    }
    if (bias != nullptr) {
      for (int32_t i = 0; i < m; ++i) {
        float* row = y + static_cast<int64_t>(i) * n;
        for (int32_t j = 0; j < n; ++j) row[j] += bias[j];
      }
    }
  }

  void MultiLinear(const float* x, int32_t m, int32_t k, const LinearOut* outs,
                   int32_t num_outs) override {
    if (m > 1) {
      for (int32_t i = 0; i < num_outs; ++i) Linear(x, outs[i].w, outs[i].bias, m, outs[i].n, k, outs[i].y);
      return;
    }
    // Decode: one parallel pass over the rows of all outputs.
    int32_t total = 0;
    for (int32_t i = 0; i < num_outs; ++i) total += outs[i].n;
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(total) * k >= (1 << 11))
    for (int32_t r = 0; r < total; ++r) {
      int32_t i = 0, row = r;
      while (row >= outs[i].n) row -= outs[i++].n;
      const float b = outs[i].bias != nullptr ? outs[i].bias[row] : 0.0f;
      outs[i].y[row] = Dot(outs[i].w + static_cast<int64_t>(row) * k, x, k) + b;
    }
  }

  void RmsNorm(const float* x, const float* w, int32_t m, int32_t d, float eps,
               float* y) override {
    for (int32_t i = 0; i < m; ++i) {
      const float* xr = x + static_cast<int64_t>(i) * d;
      float* yr = y + static_cast<int64_t>(i) * d;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int32_t j = 0; j < d; ++j) ss += xr[j] * xr[j];
      const float inv = 1.0f / std::sqrt(ss / d + eps);
      for (int32_t j = 0; j < d; ++j) yr[j] = xr[j] * inv * w[j];
    }
  }

  void Rope(float* x, const int32_t* positions, int32_t m, int32_t num_heads,
            const RopeParams& p) override {
    const int32_t hd = p.head_dim;
    const int32_t half = hd / 2;
    for (int32_t t = 0; t < m; ++t) {
      const float* cos_t = p.cos_sin + static_cast<int64_t>(positions[t]) * hd;
      const float* sin_t = cos_t + half;
      for (int32_t h = 0; h < num_heads; ++h) {
        float* v = x + (static_cast<int64_t>(t) * num_heads + h) * hd;
        if (p.interleaved) {
          for (int32_t i = 0; i < half; ++i) {
            const float v0 = v[2 * i], v1 = v[2 * i + 1];
            v[2 * i] = v0 * cos_t[i] - v1 * sin_t[i];
            v[2 * i + 1] = v0 * sin_t[i] + v1 * cos_t[i];
          }
        } else {
#pragma omp simd
          for (int32_t i = 0; i < half; ++i) {
            const float v0 = v[i], v1 = v[i + half];
            v[i] = v0 * cos_t[i] - v1 * sin_t[i];
            v[i + half] = v0 * sin_t[i] + v1 * cos_t[i];
          }
        }
      }
    }
  }

  void SiluMul(const float* gate, const float* up, int64_t n, float* out) override {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + ExpApprox(-g)) * up[i];
    }
  }

  void Add(float* x, const float* y, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  }

  void EmbeddingGather(const float* table, int32_t d, const int32_t* ids, int32_t m,
                       float* out) override {
    for (int32_t i = 0; i < m; ++i) {
      std::memcpy(out + static_cast<int64_t>(i) * d, table + static_cast<int64_t>(ids[i]) * d,
                  sizeof(float) * d);
    }
  }

  void KvWrite(const PagedKvLayer& kv, const float* k, const float* v,
               const AttentionMetadata& meta) override {
    const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
    for (int32_t t = 0; t < meta.num_tokens; ++t) {
      const int64_t slot = meta.slot_mapping[t];
      std::memcpy(kv.k + slot * row, k + t * row, sizeof(float) * row);
      std::memcpy(kv.v + slot * row, v + t * row, sizeof(float) * row);
    }
  }

  void PagedAttention(const float* q, const PagedKvLayer& kv, const AttentionMetadata& meta,
                      int32_t num_heads, float scale, float* out) override {
    const int32_t hd = kv.head_dim;
    const int32_t bs = kv.block_size;
    const int32_t group = num_heads / kv.num_kv_heads;
    const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * hd;
    token_seq_.resize(meta.num_tokens);  // [num_tokens] sequence of each token
    int64_t work = 0;
    for (int32_t s = 0; s < meta.num_seqs; ++s) {
      for (int32_t t = meta.query_start[s]; t < meta.query_start[s + 1]; ++t) {
        token_seq_[t] = s;
        work += static_cast<int64_t>(meta.positions[t] + 1) * hd * num_heads;
      }
    }
    const int32_t items = meta.num_tokens * num_heads;
#pragma omp parallel for schedule(static, 1) if (work >= (1 << 11))
    for (int32_t item = 0; item < items; ++item) {
      const int32_t t = item / num_heads, h = item % num_heads;
      const int32_t* table =
          meta.block_tables + static_cast<int64_t>(token_seq_[t]) * meta.max_blocks_per_seq;
      const int32_t ctx = meta.positions[t] + 1;
      thread_local std::vector<float> scores;  // [ctx]
      scores.resize(ctx);
      const float* qh = q + static_cast<int64_t>(item) * hd;
      const int64_t head_off = static_cast<int64_t>(h / group) * hd;
      float max_score = -INFINITY;
      // Walk the block table a block at a time; slots inside a block are contiguous.
      for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
        const float* kb = kv.k + static_cast<int64_t>(table[p0 / bs]) * bs * row + head_off;
        const int32_t n = std::min(bs, ctx - p0);
        for (int32_t j = 0; j < n; ++j) {
          const float* kp = kb + j * row;
          scores[p0 + j] = Dot(qh, kp, hd) * scale;
          max_score = std::max(max_score, scores[p0 + j]);
        }
      }
      float sum = 0.0f;
      float* sc = scores.data();
#pragma omp simd reduction(+ : sum)
      for (int32_t p = 0; p < ctx; ++p) {
        sc[p] = ExpApprox(sc[p] - max_score);
        sum += sc[p];
      }
      const float inv_sum = 1.0f / sum;
      float* oh = out + static_cast<int64_t>(item) * hd;
      std::fill(oh, oh + hd, 0.0f);
      for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
        const float* vb = kv.v + static_cast<int64_t>(table[p0 / bs]) * bs * row + head_off;
        const int32_t n = std::min(bs, ctx - p0);
        for (int32_t j = 0; j < n; ++j) {
          const float* vp = vb + j * row;
          const float wgt = scores[p0 + j] * inv_sum;
#pragma omp simd
          for (int32_t i = 0; i < hd; ++i) oh[i] += wgt * vp[i];
        }
      }
    }
  }

 private:
  std::vector<int32_t> token_seq_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace specula

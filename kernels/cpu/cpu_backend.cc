#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace specula {
namespace {

class CpuBackend final : public Backend {
 public:
  void Linear(const float* x, const float* w, const float* bias, int32_t m, int32_t n, int32_t k,
              float* y) override {
    if (m == 1) {
      // Decode path: a matrix-vector product is cheaper than a 1-row GEMM in OpenBLAS.
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, 0.0f, y, 1);
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

  void RmsNorm(const float* x, const float* w, int32_t m, int32_t d, float eps,
               float* y) override {
    for (int32_t i = 0; i < m; ++i) {
      const float* xr = x + static_cast<int64_t>(i) * d;
      float* yr = y + static_cast<int64_t>(i) * d;
      double ss = 0.0;
      for (int32_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
      for (int32_t j = 0; j < d; ++j) yr[j] = xr[j] * inv * w[j];
    }
  }

  void Rope(float* x, const int32_t* positions, int32_t m, int32_t num_heads,
            const RopeParams& p) override {
    const int32_t hd = p.head_dim;
    const int32_t half = hd / 2;
    std::vector<float> cos_t(half), sin_t(half);  // [head_dim / 2]
    for (int32_t t = 0; t < m; ++t) {
      for (int32_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions[t]) * p.inv_freq[i];
        cos_t[i] = std::cos(angle);
        sin_t[i] = std::sin(angle);
      }
      for (int32_t h = 0; h < num_heads; ++h) {
        float* v = x + (static_cast<int64_t>(t) * num_heads + h) * hd;
        for (int32_t i = 0; i < half; ++i) {
          const int32_t a = p.interleaved ? 2 * i : i;
          const int32_t b = p.interleaved ? 2 * i + 1 : i + half;
          const float v0 = v[a], v1 = v[b];
          v[a] = v0 * cos_t[i] - v1 * sin_t[i];
          v[b] = v0 * sin_t[i] + v1 * cos_t[i];
        }
      }
    }
  }

  void SiluMul(const float* gate, const float* up, int64_t n, float* out) override {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
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
    const int32_t group = num_heads / kv.num_kv_heads;
    const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * hd;
    for (int32_t s = 0; s < meta.num_seqs; ++s) {
      const int32_t* table = meta.block_tables + static_cast<int64_t>(s) * meta.max_blocks_per_seq;
      for (int32_t t = meta.query_start[s]; t < meta.query_start[s + 1]; ++t) {
        const int32_t ctx = meta.positions[t] + 1;
        scores_.resize(ctx);  // [ctx]
        for (int32_t h = 0; h < num_heads; ++h) {
          const float* qh = q + (static_cast<int64_t>(t) * num_heads + h) * hd;
          const int32_t kvh = h / group;
          float max_score = -INFINITY;
          for (int32_t p = 0; p < ctx; ++p) {
            const int64_t slot =
                static_cast<int64_t>(table[p / kv.block_size]) * kv.block_size + p % kv.block_size;
            const float* kp = kv.k + slot * row + static_cast<int64_t>(kvh) * hd;
            float dot = 0.0f;
            for (int32_t i = 0; i < hd; ++i) dot += qh[i] * kp[i];
            scores_[p] = dot * scale;
            max_score = std::max(max_score, scores_[p]);
          }
          float sum = 0.0f;
          for (int32_t p = 0; p < ctx; ++p) {
            scores_[p] = std::exp(scores_[p] - max_score);
            sum += scores_[p];
          }
          float* oh = out + (static_cast<int64_t>(t) * num_heads + h) * hd;
          std::fill(oh, oh + hd, 0.0f);
          const float inv_sum = 1.0f / sum;
          for (int32_t p = 0; p < ctx; ++p) {
            const int64_t slot =
                static_cast<int64_t>(table[p / kv.block_size]) * kv.block_size + p % kv.block_size;
            const float* vp = kv.v + slot * row + static_cast<int64_t>(kvh) * hd;
            const float wgt = scores_[p] * inv_sum;
            for (int32_t i = 0; i < hd; ++i) oh[i] += wgt * vp[i];
          }
        }
      }
    }
  }

 private:
  std::vector<float> scores_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace specula

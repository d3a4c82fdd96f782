#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/stream_gemm.h"

namespace specula {
namespace {

using cpu::Dot;
using cpu::ExpApprox;
using cpu::kStreamMaxRows;
using cpu::LinearQ8;
using cpu::Q8Matrix;
using cpu::Quantize;
using cpu::StreamGemm;

// Matrices of fewer rows multiply up to kStreamMaxRows tokens row-major (see Linear).
constexpr int32_t kPackedMinRows = 1024;

// y[n] = w[n, k] x[k]. Single-token decode is memory-bound; rows are split across threads.
// (OpenBLAS sgemv measured 2.4x slower than this single-threaded on the CI machine.)
void Gemv(const float* x, const float* w, int32_t n, int32_t k, float* y) {
  const bool parallel = static_cast<int64_t>(n) * k >= (1 << 11);
#pragma omp parallel for schedule(static) if (parallel)
  for (int32_t i = 0; i < n; ++i) y[i] = Dot(w + static_cast<int64_t>(i) * k, x, k);
}

class CpuBackend final : public Backend {
 public:
  // One threading runtime: OpenBLAS runs single-threaded inside OpenMP threads (its own pthreads
  // fought libgomp's for the cores and halved batched throughput).
  explicit CpuBackend(const CpuOptions& options) : options_(options) { openblas_set_num_threads(1); }

  const char* name() const override { return "cpu"; }
  DType dtype() const override { return DType::kF32; }
  bool on_device() const override { return false; }
  bool SupportsKvDtype(DType d) const override { return cpu::CpuKvDtype(d); }

  absl::StatusOr<void*> Alloc(size_t bytes) override {
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
    return p;
  }
  void Free(void* p) override { std::free(p); }
  absl::StatusOr<const void*> UploadWeight(const float* host, int64_t) override { return host; }
  absl::StatusOr<const void*> UploadMatrix(const float* host, int64_t rows, int64_t cols) override {
    if (host == nullptr) return host;
    if (options_.int8_weights) {
      auto q = std::make_unique<Q8Matrix>(Quantize(host, rows, cols));
      const void* key = q->q.data();
      q8_[key] = std::move(q);
      return key;
    }
    if (!cpu::PackedGemmAvailable()) return host;
    auto p = std::make_unique<cpu::PackedMatrix>(host, rows, cols);
    const void* key = p->data();
    packed_[key] = std::move(p);
    return key;
  }
  void CopyIn(void* dst, const void* host, size_t bytes) override { std::memcpy(dst, host, bytes); }
  void CopyOut(void* host, const void* src, size_t bytes) override { std::memcpy(host, src, bytes); }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::StatusOr<int64_t> KvBudgetBytes(double utilization) override {
    const int64_t avail = static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    return static_cast<int64_t>(utilization * static_cast<double>(avail));
  }

  void Linear(const void* xv, const void* wv, const void* bv, int32_t m, int32_t n, int32_t k,
              void* yv) override {
    const float *x = F(xv), *w = F(wv), *bias = F(bv);
    float* y = F(yv);
    if (const Q8Matrix* q = FindQ8(wv)) return LinearQ8(x, *q, bias, m, n, k, y);
    if (const cpu::PackedMatrix* p = Find(packed_, wv)) {
      // A few tokens through a matrix of few 64-row groups would split unevenly between the
      // cores: those take the row-major paths below.
      if (m > kStreamMaxRows || n >= kPackedMinRows) return cpu::PackedGemm(x, m, *p, bias, y);
      w = p->row_major();
    }
    if (m == 1) {
      Gemv(x, w, n, k, y);
    } else if (m <= kStreamMaxRows) {
      StreamGemm(x, m, k, w, static_cast<const float*>(nullptr), n, y, n, bias);
      return;
    } else {
      // Each thread takes a slice of the output columns.
#pragma omp parallel
      {
        const int32_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int32_t per = (n / threads + 15) / 16 * 16;
        const int32_t n0 = std::min(n, t * per), n1 = t == threads - 1 ? n : std::min(n, n0 + per);
        if (n1 > n0) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n1 - n0, k, 1.0f, x, k,
                      w + static_cast<int64_t>(n0) * k, k, 0.0f, y + n0, n);
        }
      }
    }
    if (bias != nullptr) {
      for (int32_t i = 0; i < m; ++i) {
        float* row = y + static_cast<int64_t>(i) * n;
        for (int32_t j = 0; j < n; ++j) row[j] += bias[j];
      }
    }
  }

  void LinearF32(const void* x, const void* w, int32_t m, int32_t n, int32_t k, float* y) override {
    Linear(x, w, nullptr, m, n, k, y);
  }

  void MultiLinear(const void* xv, int32_t m, int32_t k, const LinearOut* outs, int32_t num_outs) override {
    // Decode through row-major matrices (small packed ones keep their row-major original): one
    // parallel pass over the rows of all outputs, one fork/join instead of several.
    constexpr int32_t kMaxOuts = 4;
    const float* rows[kMaxOuts];
    bool fused = m == 1 && num_outs <= kMaxOuts && q8_.empty();
    for (int32_t i = 0; fused && i < num_outs; ++i) {
      const cpu::PackedMatrix* p = Find(packed_, outs[i].w);
      fused = p == nullptr || outs[i].n < kPackedMinRows;
      rows[i] = p != nullptr ? p->row_major() : F(outs[i].w);
    }
    if (!fused) {
      for (int32_t i = 0; i < num_outs; ++i) Linear(xv, outs[i].w, outs[i].bias, m, outs[i].n, k, outs[i].y);
      return;
    }
    const float* x = F(xv);
    int32_t total = 0;
    for (int32_t i = 0; i < num_outs; ++i) total += outs[i].n;
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(total) * k >= (1 << 11))
    for (int32_t r = 0; r < total; ++r) {
      int32_t i = 0, row = r;
      while (row >= outs[i].n) row -= outs[i++].n;
      const float b = outs[i].bias != nullptr ? F(outs[i].bias)[row] : 0.0f;
      F(outs[i].y)[row] = Dot(rows[i] + static_cast<int64_t>(row) * k, x, k) + b;
    }
  }

  void RmsNorm(const void* xv, const void* wv, int32_t m, int32_t d, float eps, void* yv) override {
    const float *x = F(xv), *w = F(wv);
    float* y = F(yv);
    for (int32_t i = 0; i < m; ++i) NormRow(x + static_cast<int64_t>(i) * d, w, d, eps, y + static_cast<int64_t>(i) * d);
  }

  void AddRmsNorm(void* xv, const void* deltav, const void* wv, int32_t m, int32_t d, float eps,
                  void* yv) override {
    float* x = F(xv);
    const float *delta = F(deltav), *w = F(wv);
    float* y = F(yv);
    for (int32_t i = 0; i < m; ++i) {
      float* xr = x + static_cast<int64_t>(i) * d;
      const float* dr = delta + static_cast<int64_t>(i) * d;
#pragma omp simd
      for (int32_t j = 0; j < d; ++j) xr[j] += dr[j];
      NormRow(xr, w, d, eps, y + static_cast<int64_t>(i) * d);
    }
  }

  void Rope(void* xv, const int32_t* positions, int32_t m, int32_t num_heads, const RopeParams& p) override {
    float* x = F(xv);
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

  void SiluMul(const void* gatev, const void* upv, int64_t n, void* outv) override {
    const float *gate = F(gatev), *up = F(upv);
    float* out = F(outv);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + ExpApprox(-g)) * up[i];
    }
  }

  void Add(void* xv, const void* yv, int64_t n) override {
    float* x = F(xv);
    const float* y = F(yv);
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  }

  void EmbeddingGather(const void* tablev, int32_t d, const int32_t* ids, int32_t m, void* outv) override {
    const float* table = F(tablev);
    float* out = F(outv);
    if (const cpu::PackedMatrix* p = Find(packed_, tablev)) {
      for (int32_t i = 0; i < m; ++i) p->Row(ids[i], out + static_cast<int64_t>(i) * d);
      return;
    }
    if (const Q8Matrix* q = FindQ8(tablev)) {
      for (int32_t i = 0; i < m; ++i) {
        const int8_t* row = q->q.data() + static_cast<int64_t>(ids[i]) * d;
        const float a = q->scale[ids[i]];
        for (int32_t j = 0; j < d; ++j) out[static_cast<int64_t>(i) * d + j] = row[j] * a;
      }
      return;
    }
    for (int32_t i = 0; i < m; ++i) {
      std::memcpy(out + static_cast<int64_t>(i) * d, table + static_cast<int64_t>(ids[i]) * d, sizeof(float) * d);
    }
  }

  void KvWrite(const PagedKvLayer& kv, const void* k, const void* v, const AttentionMetadata& meta) override {
    cpu::WriteKv(kv, F(k), F(v), meta);
  }
  void CopyKvBlocks(const PagedKvLayer& kv, const int32_t* src, const int32_t* dst, int32_t n) override {
    cpu::CopyKvBlocks(kv, src, dst, n);
  }

  void Sample(const float* logits, int32_t m, int32_t vocab, const SampleArgs& args, float* probs,
              int32_t* tokens) override {
    cpu::SampleRows(logits, m, vocab, args, probs, tokens);
  }
  void VerifyDrafts(const VerifyArgs& args) override { cpu::VerifyRows(args); }

  void PagedAttention(const void* q, const PagedKvLayer& kv, const AttentionMetadata& meta, int32_t num_heads,
                      float scale, void* out) override {
    attention_.Run(F(q), kv, meta, num_heads, scale, F(out));
  }

 private:
  // Host float views of the typed interface (the CPU backend's dtype is always f32).
  static float* F(void* p) { return static_cast<float*>(p); }
  static const float* F(const void* p) { return static_cast<const float*>(p); }

  static void NormRow(const float* xr, const float* w, int32_t d, float eps, float* yr) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int32_t j = 0; j < d; ++j) ss += xr[j] * xr[j];
    const float inv = 1.0f / std::sqrt(ss / d + eps);
    for (int32_t j = 0; j < d; ++j) yr[j] = xr[j] * inv * w[j];
  }

  // The stored matrix behind a weight pointer, or null for plain row-major float32 data (weights
  // not uploaded as matrices, activations).
  template <typename T>
  static const T* Find(const absl::flat_hash_map<const void*, std::unique_ptr<T>>& map, const void* w) {
    if (map.empty()) return nullptr;
    auto it = map.find(w);
    return it == map.end() ? nullptr : it->second.get();
  }
  const Q8Matrix* FindQ8(const void* w) const { return Find(q8_, w); }

  const CpuOptions options_;
  // Matrices by the pointer UploadMatrix returned.
  absl::flat_hash_map<const void*, std::unique_ptr<Q8Matrix>> q8_;
  absl::flat_hash_map<const void*, std::unique_ptr<cpu::PackedMatrix>> packed_;
  cpu::PagedAttention attention_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuOptions& options) { return std::make_unique<CpuBackend>(options); }

}  // namespace specula

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
    const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
    for (int32_t t = 0; t < meta.num_tokens; ++t) {
      const int64_t slot = meta.slot_mapping[t];
      if (slot < 0) continue;  // padding
      std::memcpy(F(kv.k) + slot * row, F(k) + t * row, sizeof(float) * row);
      std::memcpy(F(kv.v) + slot * row, F(v) + t * row, sizeof(float) * row);
    }
  }

  void CopyKvBlocks(const PagedKvLayer& kv, const int32_t* src, const int32_t* dst, int32_t n) override {
    const int64_t block = static_cast<int64_t>(kv.block_size) * kv.num_kv_heads * kv.head_dim;
    for (int32_t i = 0; i < n; ++i) {
      std::memcpy(F(kv.k) + dst[i] * block, F(kv.k) + src[i] * block, sizeof(float) * block);
      std::memcpy(F(kv.v) + dst[i] * block, F(kv.v) + src[i] * block, sizeof(float) * block);
    }
  }

  void Sample(const float* logits, int32_t m, int32_t vocab, const SampleArgs& args, float* probs,
              int32_t* tokens) override {
    cpu::SampleRows(logits, m, vocab, args, probs, tokens);
  }
  void VerifyDrafts(const VerifyArgs& args) override { cpu::VerifyRows(args); }

  void PagedAttention(const void* qv, const PagedKvLayer& kvv, const AttentionMetadata& meta, int32_t num_heads,
                      float scale, void* outv) override {
    const float* q = F(qv);
    float* out = F(outv);
    const HostKv kv{F(kvv.k), F(kvv.v), kvv.num_kv_heads, kvv.block_size, kvv.head_dim};
    // Sequences with many new tokens (prefill chunks) go through GEMMs; the rest (decode, short
    // verification runs) through the per-token loop.
    gemm_seqs_.clear();
    loop_tokens_.clear();
    for (int32_t s = 0; s < meta.num_seqs; ++s) {
      if (meta.query_start[s + 1] - meta.query_start[s] >= kGemmMinTokens) {
        gemm_seqs_.push_back(s);
      } else {
        for (int32_t t = meta.query_start[s]; t < meta.query_start[s + 1]; ++t) loop_tokens_.push_back({t, s});
      }
    }
    if (!gemm_seqs_.empty()) AttentionGemm(q, kv, meta, num_heads, scale, out);
    if (!loop_tokens_.empty()) AttentionLoop(q, kv, meta, num_heads, scale, out);
  }

 private:
  static constexpr int32_t kGemmMinTokens = 8;

  // Host float views of the typed interface (the CPU backend's dtype is always f32).
  static float* F(void* p) { return static_cast<float*>(p); }
  static const float* F(const void* p) { return static_cast<const float*>(p); }

  // One layer's pool as float pointers.
  struct HostKv {
    const float* k;
    const float* v;
    int32_t num_kv_heads, block_size, head_dim;
  };

  static void NormRow(const float* xr, const float* w, int32_t d, float eps, float* yr) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int32_t j = 0; j < d; ++j) ss += xr[j] * xr[j];
    const float inv = 1.0f / std::sqrt(ss / d + eps);
    for (int32_t j = 0; j < d; ++j) yr[j] = xr[j] * inv * w[j];
  }

  // Copies K and V of positions [0, ctx) of one KV head into contiguous [ctx, head_dim] buffers.
  static void Gather(const HostKv& kv, const int32_t* table, int32_t kvh, int32_t ctx, float* k, float* v) {
    const int32_t hd = kv.head_dim, bs = kv.block_size;
    const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * hd;
    for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
      const int64_t base = static_cast<int64_t>(table[p0 / bs]) * bs * row + static_cast<int64_t>(kvh) * hd;
      for (int32_t j = 0; j < std::min(bs, ctx - p0); ++j) {
        std::memcpy(k + static_cast<int64_t>(p0 + j) * hd, kv.k + base + j * row, sizeof(float) * hd);
        std::memcpy(v + static_cast<int64_t>(p0 + j) * hd, kv.v + base + j * row, sizeof(float) * hd);
      }
    }
  }

  // Softmax of row[0, valid) in place; row[valid, ctx) is zeroed (causal mask).
  static void MaskedSoftmax(float* row, int32_t valid, int32_t ctx) {
    float mx = -INFINITY;
    for (int32_t p = 0; p < valid; ++p) mx = std::max(mx, row[p]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int32_t p = 0; p < valid; ++p) {
      row[p] = ExpApprox(row[p] - mx);
      sum += row[p];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int32_t p = 0; p < valid; ++p) row[p] *= inv;
    std::fill(row + valid, row + ctx, 0.0f);
  }

  void AttentionGemm(const float* q, const HostKv& kv, const AttentionMetadata& meta, int32_t num_heads,
                     float scale, float* out) {
    const int32_t hd = kv.head_dim;
    const int32_t group = num_heads / kv.num_kv_heads;
    const int32_t items = static_cast<int32_t>(gemm_seqs_.size()) * kv.num_kv_heads;
#pragma omp parallel for schedule(dynamic, 1)
    for (int32_t item = 0; item < items; ++item) {
      const int32_t s = gemm_seqs_[item / kv.num_kv_heads], kvh = item % kv.num_kv_heads;
      const int32_t t0 = meta.query_start[s], m = meta.query_start[s + 1] - t0;
      const int32_t ctx = meta.positions[t0 + m - 1] + 1;  // a sequence's new tokens are consecutive
      thread_local std::vector<float> kbuf, vbuf, sbuf;  // [ctx, hd], [ctx, hd], [m, ctx]
      kbuf.resize(static_cast<size_t>(ctx) * hd);
      vbuf.resize(kbuf.size());
      sbuf.resize(static_cast<size_t>(m) * ctx);
      Gather(kv, meta.block_tables + static_cast<int64_t>(s) * meta.max_blocks_per_seq, kvh, ctx, kbuf.data(),
             vbuf.data());
      for (int32_t g = 0; g < group; ++g) {
        const int64_t qo = (static_cast<int64_t>(t0) * num_heads + kvh * group + g) * hd;
        // scores[m, ctx] = scale * Q_h[m, hd] K^T, then the causal softmax, then out_h = P V.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, ctx, hd, scale, q + qo, num_heads * hd, kbuf.data(),
                    hd, 0.0f, sbuf.data(), ctx);
        for (int32_t i = 0; i < m; ++i) MaskedSoftmax(sbuf.data() + static_cast<int64_t>(i) * ctx, meta.positions[t0 + i] + 1, ctx);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hd, ctx, 1.0f, sbuf.data(), ctx, vbuf.data(), hd,
                    0.0f, out + qo, num_heads * hd);
      }
    }
  }

  void AttentionLoop(const float* q, const HostKv& kv, const AttentionMetadata& meta, int32_t num_heads,
                     float scale, float* out) {
    const int32_t hd = kv.head_dim, bs = kv.block_size;
    const int32_t group = num_heads / kv.num_kv_heads;
    const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * hd;
    int64_t work = 0;
    for (const auto& [t, s] : loop_tokens_) work += static_cast<int64_t>(meta.positions[t] + 1) * hd * num_heads;
#if defined(__AVX512F__)
    // Enough tokens to keep the cores busy one token each: all heads of a token together.
    const int32_t tokens = static_cast<int32_t>(loop_tokens_.size());
    constexpr auto handled = [](int32_t d) { return d % 16 == 0 && (d / 16 <= 6 || d / 16 == 8); };  // the cases below
    if (tokens >= 4 * omp_get_max_threads() && handled(hd)) {
#pragma omp parallel for schedule(dynamic, 1)
      for (int32_t i = 0; i < tokens; ++i) {
        const auto [t, s] = loop_tokens_[i];
        const int32_t ctx = meta.positions[t] + 1;
        thread_local std::vector<float> scores;  // [num_heads, ctx]
        scores.resize(static_cast<size_t>(num_heads) * ctx);
        const int32_t* table = meta.block_tables + static_cast<int64_t>(s) * meta.max_blocks_per_seq;
        const float* qt = q + static_cast<int64_t>(t) * num_heads * hd;
        float* ot = out + static_cast<int64_t>(t) * num_heads * hd;
        switch (hd / 16) {
#define SPECULA_ATTEND_ALL(NV)                                                                                     \
  case NV:                                                                                                         \
    cpu::AttendAllHeads<NV>(qt, kv.k, kv.v, table, bs, row, ctx, num_heads, group, scale, scores.data(), ot, \
                            MaskedSoftmax);                                                                        \
    break;
          SPECULA_ATTEND_ALL(1)
          SPECULA_ATTEND_ALL(2)
          SPECULA_ATTEND_ALL(3)
          SPECULA_ATTEND_ALL(4)
          SPECULA_ATTEND_ALL(5)
          SPECULA_ATTEND_ALL(6)
          SPECULA_ATTEND_ALL(8)
#undef SPECULA_ATTEND_ALL
        }
      }
      return;
    }
#endif
    const int32_t items = static_cast<int32_t>(loop_tokens_.size()) * num_heads;
#pragma omp parallel for schedule(static, 1) if (work >= (1 << 11))
    for (int32_t item = 0; item < items; ++item) {
      const auto [t, s] = loop_tokens_[item / num_heads];
      const int32_t h = item % num_heads;
      const int32_t* table = meta.block_tables + static_cast<int64_t>(s) * meta.max_blocks_per_seq;
      const int32_t ctx = meta.positions[t] + 1;
      thread_local std::vector<float> scores;  // [ctx]
      scores.resize(ctx);
      float* sc = scores.data();
      const float* qh = q + (static_cast<int64_t>(t) * num_heads + h) * hd;
      const int64_t head_off = static_cast<int64_t>(h / group) * hd;
      float* oh = out + (static_cast<int64_t>(t) * num_heads + h) * hd;
      AttendOne(qh, kv.k + head_off, kv.v + head_off, table, bs, row, ctx, hd, scale, sc, oh);
    }
  }

  // One query head over ctx positions of one paged KV head: sc[ctx] is scratch.
  static void AttendOne(const float* qh, const float* kh, const float* vh, const int32_t* table, int32_t bs,
                        int64_t row, int32_t ctx, int32_t hd, float scale, float* sc, float* oh) {
#if defined(__AVX512F__)
    // 16 scores per tree reduction: the per-score horizontal sums made this loop a third of a
    // 32-sequence decode step.
    switch (hd) {
#define SPECULA_ATTEND(NV)                                       \
  case 16 * NV:                                                  \
    cpu::ScoreKeys<NV>(qh, kh, table, bs, row, ctx, scale, sc);  \
    MaskedSoftmax(sc, ctx, ctx);                                 \
    cpu::WeightedSum512<NV>(sc, ctx, vh, table, bs, row, oh);    \
    return;
      SPECULA_ATTEND(2)
      SPECULA_ATTEND(3)
      SPECULA_ATTEND(4)
      SPECULA_ATTEND(5)
      SPECULA_ATTEND(6)
      SPECULA_ATTEND(8)
#undef SPECULA_ATTEND
      default: break;
    }
#endif
    for (int32_t p0 = 0; p0 < ctx; p0 += bs) {  // a block at a time: slots in a block are contiguous
      const float* kb = kh + static_cast<int64_t>(table[p0 / bs]) * bs * row;
      const int32_t n = std::min(bs, ctx - p0);
      for (int32_t j = 0; j < n; ++j) sc[p0 + j] = Dot(qh, kb + j * row, hd) * scale;
    }
    MaskedSoftmax(sc, ctx, ctx);
    switch (hd) {
      case 32: cpu::WeightedSumRegs<4>(sc, ctx, vh, table, bs, row, oh); break;
      case 48: cpu::WeightedSumRegs<6>(sc, ctx, vh, table, bs, row, oh); break;
      case 64: cpu::WeightedSumRegs<8>(sc, ctx, vh, table, bs, row, oh); break;
      case 128: cpu::WeightedSumRegs<16>(sc, ctx, vh, table, bs, row, oh); break;
      default: cpu::WeightedSum(sc, ctx, vh, table, bs, row, hd, oh);
    }
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
  std::vector<int32_t> gemm_seqs_;                        // sequences attended with GEMMs
  std::vector<std::pair<int32_t, int32_t>> loop_tokens_;  // (token, sequence) for the loop path
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuOptions& options) { return std::make_unique<CpuBackend>(options); }

}  // namespace specula

#include "kernels/cpu/cpu_backend.h"

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
#include "kernels/cpu/quant_gemm.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/parallel_rows.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/stream_gemm.h"

namespace specula {
namespace {

using cpu::ExpApprox;
using cpu::LinearQ8;
using cpu::Q8Matrix;
using cpu::Quantize;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& options) : options_(options) {}

  const char* name() const override { return "cpu"; }
  DType dtype() const override { return DType::kF32; }
  bool on_device() const override { return false; }
  bool SupportsKvDtype(DType d) const override { return cpu::CpuKvDtype(d); }

  absl::StatusOr<void*> Alloc(size_t bytes) override {
    return Allocated(std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64), bytes);
  }
  // In 2 MB pages: a 32-sequence decode step's attention reads 9 KB blocks scattered over the pool,
  // and missed the TLB on most of them in 4 KB pages (attention_bench: 1.1-1.2x slower). Only the KV
  // pool: with every buffer of 2 MB or more in huge pages, `generate --max-tokens 1` started in
  // 70.8 ms against 55.7 (startup_bench, one run of 9 each).
  absl::StatusOr<void*> AllocScattered(size_t bytes) override { return Allocated(cpu::AllocHugePages(bytes), bytes); }
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
    auto p = std::make_unique<cpu::PackedMatrix>(host, rows, cols, &arena_);
    const void* key = p->data();
    packed_[key] = std::move(p);
    return key;
  }
  // GGUF blocks are computed on where they lie (the mapped file; the returned key is `blocks`),
  // except where RepackForProducts has an arrangement of its own (the key is then the copy's).
  absl::StatusOr<const void*> UploadQuantMatrix(const void* blocks, QuantType type, int64_t rows,
                                                int64_t cols) override {
    if (type == QuantType::kF32) return UploadMatrix(static_cast<const float*>(blocks), rows, cols);
    auto q = std::make_unique<cpu::QuantMatrix>(cpu::QuantMatrix{blocks, type, rows, cols, !options_.int8_activations});
    // Q4_1 and Q8_0 in the products' own arrangement (unpacked with no shuffles: a SmolLM2 Q4_1
    // decode step took ~40% less): a copy, so the caller may release the GGUF blocks. It goes in
    // the arena's 2 MB pages, as packed F32 does: SmolLM2 Q4_1's 1-token step 1.91-1.93 ms against
    // 2.07-2.14 in 4 KB pages, 9 tokens 3.26-3.30 against 3.38-3.42 (Zen 5, step_bench, alternated
    // twice; in the VM's other phase 1 token even, 5 tokens 3-4% faster), and load no slower.
    if (std::vector<uint8_t> repacked = cpu::RepackForProducts(*q); !repacked.empty()) {
      float* owned = arena_.Alloc((repacked.size() + sizeof(float) - 1) / sizeof(float));
      std::memcpy(owned, repacked.data(), repacked.size());
      q->blocks = owned;
      q->repacked = true;
    }
    const void* key = q->blocks;
    quant_[key] = std::move(q);
    return key;
  }
  void CopyIn(void* dst, const void* host, size_t bytes) override { std::memcpy(dst, host, bytes); }
  void CopyOut(void* host, const void* src, size_t bytes) override { std::memcpy(host, src, bytes); }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::StatusOr<int64_t> KvBudgetBytes(double utilization) override {
    const int64_t avail = static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    return static_cast<int64_t>(utilization * static_cast<double>(avail));
  }

  // Every product of a matrix takes one path whatever the number of tokens (packed on AVX-512
  // and AVX2, row-major tiles elsewhere), so a token's output does not depend on its batch; see
  // packed_gemm.h. Int8 matrices (opt-in) are the exception: they change the output anyway.
  void Linear(const void* x, const void* w, const void* bias, int32_t m, int32_t n, int32_t k, void* y) override {
    const LinearOut out{w, bias, n, y};
    MultiLinear(x, m, k, &out, 1);
  }

  void LinearF32(const void* x, const void* w, int32_t m, int32_t n, int32_t k, float* y) override {
    Linear(x, w, nullptr, m, n, k, y);
  }

  // All outputs in one parallel pass: one fork/join for Q/K/V, one for gate/up.
  void MultiLinear(const void* xv, int32_t m, int32_t k, const LinearOut* outs, int32_t num_outs) override {
    constexpr int32_t kMaxOuts = 4;
    const float* x = F(xv);
    // Matrices of different kinds, or too many: one at a time.
    const auto one_by_one = [&] {
      for (int32_t i = 0; i < num_outs; ++i) OneLinear(x, outs[i], m, k);
    };
    if (num_outs > kMaxOuts || FindQ8(outs[0].w) != nullptr) return one_by_one();
    if (Find(quant_, outs[0].w) != nullptr) {
      cpu::QuantOut quant[kMaxOuts];
      if (!Gather(quant_, outs, num_outs, quant)) return one_by_one();
      return cpu::LinearQuantMulti(x, m, k, quant, num_outs);
    }
    if (Find(packed_, outs[0].w) != nullptr) {
      cpu::PackedOut packed[kMaxOuts];
      if (!Gather(packed_, outs, num_outs, packed)) return one_by_one();
      return cpu::PackedGemm(x, m, packed, num_outs);
    }
    cpu::StreamOut<float> rows[kMaxOuts];
    for (int32_t i = 0; i < num_outs; ++i) rows[i] = {F(outs[i].w), nullptr, F(outs[i].bias), outs[i].n, F(outs[i].y)};
    cpu::StreamGemm(x, m, k, rows, num_outs);
  }

  void RmsNorm(const void* xv, const void* wv, int32_t m, int32_t d, float eps, void* yv) override {
    const float *x = F(xv), *w = F(wv);
    float* y = F(yv);
    cpu::ParallelFor(m, d, [&](int64_t i) { NormRow(x + i * d, w, d, eps, y + i * d); });
  }

  void AddRmsNorm(void* xv, const void* deltav, const void* wv, int32_t m, int32_t d, float eps,
                  void* yv) override {
    float* x = F(xv);
    const float *delta = F(deltav), *w = F(wv);
    float* y = F(yv);
    cpu::ParallelFor(m, d, [&](int64_t i) {
      float* xr = x + i * d;
      const float* dr = delta + i * d;
#pragma omp simd
      for (int32_t j = 0; j < d; ++j) xr[j] += dr[j];
      NormRow(xr, w, d, eps, y + i * d);
    });
  }

  void Rope(void* xv, const int32_t* positions, int32_t m, int32_t num_heads, const RopeParams& p) override {
    float* x = F(xv);
    const int32_t hd = p.head_dim;
    const int32_t half = hd / 2;
    cpu::ParallelFor(m, static_cast<int64_t>(num_heads) * hd, [&](int64_t t) {
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
    });
  }

  void SiluMul(const void* gatev, const void* upv, int64_t n, void* outv) override {
    const float *gate = F(gatev), *up = F(upv);
    float* out = F(outv);
    // Pieces of kPiece elements (a multiple of every vector width), so that each element takes
    // the vector or the scalar path as it would in one pass: the same bits on any thread count.
    constexpr int64_t kPiece = 1024;
    cpu::ParallelFor((n + kPiece - 1) / kPiece, kPiece, [&](int64_t piece) {
      int64_t i = piece * kPiece;
      const int64_t end = std::min(n, i + kPiece);
#ifdef SPECULA_SIMD
      // The vector layer's Exp: GCC kept the `omp simd` loop below scalar (ExpApprox's clamp).
      using S = cpu::SimdWide;
      const S::V one = S::Set1(1.0f);
      for (; i + S::kLanes <= end; i += S::kLanes) {
        const S::V g = S::Load(gate + i);
        S::Store(out + i, S::Mul(S::Div(g, S::Add(one, cpu::ExpLanes<S>(S::Sub(S::Zero(), g)))), S::Load(up + i)));
      }
#endif
      for (; i < end; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + ExpApprox(-g)) * up[i];
      }
    });
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
      // A packed row is a column of its group: d cache lines, each a miss (the table streams
      // past between steps); two cores wait on twice as many at once.
      cpu::ParallelFor(m, d, [&](int64_t i) { p->Row(ids[i], out + i * d); });
      return;
    }
    if (const cpu::QuantMatrix* q = Find(quant_, tablev)) {
      for (int32_t i = 0; i < m; ++i) cpu::QuantRow(*q, ids[i], out + static_cast<int64_t>(i) * d);
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

  void Argmax(const float* logits, int32_t m, int32_t vocab, int32_t* tokens) override {
    cpu::ArgmaxRows(logits, m, vocab, tokens);
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
  // An allocation's result: ResourceExhausted, naming the size, for null.
  static absl::StatusOr<void*> Allocated(void* p, size_t bytes) {
    if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
    return p;
  }
  // Host float views of the typed interface (the CPU backend's dtype is always f32).
  static float* F(void* p) { return static_cast<float*>(p); }
  static const float* F(const void* p) { return static_cast<const float*>(p); }

  // One product through the matrix's own path (int8, or a call with many outputs).
  void OneLinear(const float* x, const LinearOut& out, int32_t m, int32_t k) {
    if (const Q8Matrix* q = FindQ8(out.w)) return LinearQ8(x, *q, F(out.bias), m, out.n, k, F(out.y));
    if (const cpu::QuantMatrix* q = Find(quant_, out.w)) return cpu::LinearQuant(x, *q, F(out.bias), m, out.n, k, F(out.y));
    MultiLinear(x, m, k, &out, 1);
  }

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
  // {matrix, bias, y} of every output into out[], or false when one is not a matrix of `map`.
  template <typename T, typename Out>
  static bool Gather(const absl::flat_hash_map<const void*, std::unique_ptr<T>>& map, const LinearOut* outs,
                     int32_t num_outs, Out* out) {
    for (int32_t i = 0; i < num_outs; ++i) {
      out[i] = {Find(map, outs[i].w), F(outs[i].bias), F(outs[i].y)};
      if (out[i].w == nullptr) return false;
    }
    return true;
  }

  const CpuOptions options_;
  // Matrices by the pointer UploadMatrix returned.
  absl::flat_hash_map<const void*, std::unique_ptr<Q8Matrix>> q8_;
  // GGUF blocks (not owned) or, where repacked, their copy in arena_.
  absl::flat_hash_map<const void*, std::unique_ptr<cpu::QuantMatrix>> quant_;
  cpu::PackedArena arena_;  // packed and repacked matrices' memory (declared first: destroyed after them)
  absl::flat_hash_map<const void*, std::unique_ptr<cpu::PackedMatrix>> packed_;
  cpu::PagedAttention attention_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuOptions& options) { return std::make_unique<CpuBackend>(options); }

}  // namespace specula

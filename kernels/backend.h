// The op interface every backend implements. The model is written once against it; the CPU backend
// (kernels/cpu/) is the reference that every faster backend (kernels/cuda/) is tested against.
//
// Memory: every tensor argument lives in the backend's memory (host memory for the CPU backend,
// device memory for CUDA), allocated with Alloc() and filled with CopyIn()/UploadWeight(). Tensors
// typed `void*` hold elements of the backend's dtype() (weights, activations, KV); `float*` and
// `int32_t*` arguments are float32 and int32 whatever the dtype. Shapes are given in brackets.
//
// Errors: ops return nothing; a backend that can fail asynchronously (CUDA) records the first
// failure, naming the op, and returns it from Sync(). After a failure, later ops do nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace specula {

// One layer's slice of the paged KV pool. Block b is the elements [b * B, (b + 1) * B) of k and of
// v, B = block_size * num_kv_heads * head_dim (whole blocks are copied and zeroed as such); within a
// block the order is the backend's: the CPU's is [num_kv_heads, block_size, head_dim]
// (cpu::KvOffset: each head's slots contiguous, as its attention reads them), CUDA's
// [block_size, num_kv_heads, head_dim]. Elements are of `dtype` (the KV cache dtype, which may
// differ from the backend's compute dtype: see Backend::SupportsKvDtype).
struct PagedKvLayer {
  void* k = nullptr;  // [num_blocks, block_size * num_kv_heads * head_dim] (see above)
  void* v = nullptr;  // [num_blocks, block_size * num_kv_heads * head_dim]
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF32;
};

// Where every new token of a batch sits. A token at position p attends to positions [0, p] of its
// own sequence (causal among the new tokens too), read through the sequence's block table. A
// padding token (CUDA-graph batches) has slot -1: its K/V is not written and its output is zero.
struct AttentionMetadata {
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  const int32_t* query_start = nullptr;   // [num_seqs + 1] token offsets of each sequence
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* slot_mapping = nullptr;  // [num_tokens] block_id * block_size + offset, or -1
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq], padded with -1
  int32_t max_blocks_per_seq = 0;
};

struct RopeParams {
  int32_t head_dim = 0;
  // true: rotate adjacent pairs (2i, 2i+1) as llama2.c and GGUF do;
  // false: rotate halves (i, i + head_dim/2) as HF checkpoints do.
  bool interleaved = false;
  // [max_positions, head_dim] float32: per position, cos of the head_dim/2 pair angles, then their
  // sin (rope_theta and scaling applied). Built once per model, as vLLM's cos_sin_cache.
  const float* cos_sin = nullptr;
};

// Per-row sampling settings for Backend::Sample, all float32/int32 in backend memory.
struct SampleArgs {
  const float* temperature = nullptr;  // [m]; 0 = greedy (argmax, lowest index on ties)
  const int32_t* top_k = nullptr;      // [m]; 0 = off. Keeps logits >= the k-th largest.
  const float* top_p = nullptr;        // [m]; 1 = off. Keeps the fewest most likely tokens whose
                                       // top-k-renormalized mass reaches top_p (ties kept).
  const float* uniform = nullptr;      // [m] in [0, 1): the draw, by inverse CDF in token order
  const int32_t* probs_row = nullptr;  // [m]: the row of `probs` each logits row's distribution goes
                                       // to; null = the same row
};

// Rejection-sampling verification (verify/rejection_sampler.h) for a batch, on the backend.
struct VerifyArgs {
  int32_t num_seqs = 0;
  int32_t k = 0;                         // draft slots per sequence
  int32_t vocab = 0;
  const int32_t* num_drafts = nullptr;   // [num_seqs], each <= k
  const int32_t* draft = nullptr;        // [num_seqs, k]
  const float* target_probs = nullptr;   // [num_seqs, k + 1, vocab] processed distributions
  const float* draft_probs = nullptr;    // [num_seqs, k, vocab]; null = one-hot drafts (n-gram)
  const float* uniform_accept = nullptr; // [num_seqs, k] accept draws
  const float* uniform_final = nullptr;  // [num_seqs] the recovered or bonus draw
  int32_t* num_accepted = nullptr;       // [num_seqs] out
  int32_t* tokens = nullptr;             // [num_seqs, k + 1] out: accepted, then recovered/bonus
  // Each sequence's first row in target_probs and in draft_probs (its rows follow it); null: the
  // dense layouts above, s * (k + 1) and s * k.
  const int32_t* target_row = nullptr;   // [num_seqs]
  const int32_t* draft_row = nullptr;    // [num_seqs]
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;
  // Element type of weights, activations and KV.
  virtual DType dtype() const = 0;
  // True when backend memory is not host-addressable (results come back through CopyOut).
  virtual bool on_device() const = 0;
  // Element types the KV pool may hold (KvWrite converts into it, attention reads from it). The
  // default is the compute dtype only; the CPU backend also stores bf16 (--kv-cache-dtype).
  virtual bool SupportsKvDtype(DType d) const { return d == dtype(); }
  // The queue a device backend orders its ops on (a cudaStream_t for CUDA), so that a
  // communicator's collectives are ordered with them; null on the host.
  virtual void* native_stream() const { return nullptr; }

  // --- Memory -------------------------------------------------------------------------------
  // ResourceExhausted, naming the size, when out of memory.
  virtual absl::StatusOr<void*> Alloc(size_t bytes) = 0;
  // Memory read in small pieces scattered over all of it (the KV pool, whose blocks a sequence
  // takes anywhere), which a backend may place differently: the CPU backend uses 2 MB pages. Freed
  // with Free().
  virtual absl::StatusOr<void*> AllocScattered(size_t bytes) { return Alloc(bytes); }
  virtual void Free(void* p) = 0;
  // Converts n float32 host values to dtype() in backend memory owned by the backend for its
  // lifetime. The CPU backend (f32) returns `host` itself: no copy.
  virtual absl::StatusOr<const void*> UploadWeight(const float* host, int64_t n) = 0;
  // A weight matrix [rows, cols] that only Linear, LinearF32, MultiLinear (as w) and
  // EmbeddingGather (as table) read: a backend may keep it in a format of its own (the CPU
  // backend's weight-only int8). The default is UploadWeight.
  virtual absl::StatusOr<const void*> UploadMatrix(const float* host, int64_t rows, int64_t cols) {
    return UploadWeight(host, rows * cols);
  }
  // A matrix [rows, cols] stored as rows of GGUF blocks of `type` (core/quant.h), read only as
  // UploadMatrix's are. The CPU backend computes on the blocks where they lie (no copy), except
  // Q4_1, which it copies into its products' own arrangement (a permutation of the bytes). The
  // default dequantizes to float32 and uploads that, for backends that copy (a device).
  virtual absl::StatusOr<const void*> UploadQuantMatrix(const void* blocks, QuantType type, int64_t rows,
                                                        int64_t cols) {
    if (type == QuantType::kF32) return UploadMatrix(static_cast<const float*>(blocks), rows, cols);
    std::vector<float> host(static_cast<size_t>(rows * cols));  // [rows, cols]
    const int64_t row_bytes = QuantRowBytes(type, cols);
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(type, static_cast<const uint8_t*>(blocks) + r * row_bytes, cols, host.data() + r * cols);
    }
    absl::StatusOr<const void*> up = UploadMatrix(host.data(), rows, cols);
    if (up.ok() && *up == host.data()) {
      return absl::UnimplementedError(absl::StrCat(name(), ": cannot keep ", QuantTypeName(type), " weights"));
    }
    return up;
  }
  // Byte copies, ordered with the ops. CopyOut's data is in place once Sync() returns.
  virtual void CopyIn(void* dst, const void* host, size_t bytes) = 0;
  virtual void CopyOut(void* host, const void* src, size_t bytes) = 0;
  // Waits for every op issued so far; returns the first error since the last Sync.
  virtual absl::Status Sync() = 0;
  // Bytes the KV pool may take: `utilization` of total memory minus what is in use (device), or
  // a fixed share of physical memory (host).
  virtual absl::StatusOr<int64_t> KvBudgetBytes(double utilization) = 0;

  // --- Graphs (decode steps replayed without launch overhead) ----------------------------------
  virtual bool SupportsGraphs() const { return false; }
  // Ops between BeginCapture and EndCapture are recorded, not run, and replayed by Replay(key).
  virtual void BeginCapture() {}
  virtual absl::Status EndCapture(int64_t /*key*/) { return absl::UnimplementedError("no graphs"); }
  // False when no graph was captured for `key`.
  virtual bool Replay(int64_t /*key*/) { return false; }
  virtual void ClearGraphs() {}

  // --- Ops --------------------------------------------------------------------------------------
  // y[m, n] = x[m, k] * w[n, k]^T + bias[n] (bias may be null).
  virtual void Linear(const void* x, const void* w, const void* bias, int32_t m, int32_t n,
                      int32_t k, void* y) = 0;
  // The same product with float32 output (logits).
  virtual void LinearF32(const void* x, const void* w, int32_t m, int32_t n, int32_t k,
                         float* y) = 0;
  // Several products of the same input in one call (Q/K/V, gate/up), so a backend can run them in
  // one parallel pass: outs[i].y[m, outs[i].n] = x[m, k] * outs[i].w[n, k]^T + outs[i].bias.
  struct LinearOut {
    const void* w;
    const void* bias;  // may be null
    int32_t n;
    void* y;
  };
  virtual void MultiLinear(const void* x, int32_t m, int32_t k, const LinearOut* outs,
                           int32_t num_outs) = 0;
  // y[m, d] = x[m, d] / rms(x) * w[d]. In-place (y == x) is allowed.
  virtual void RmsNorm(const void* x, const void* w, int32_t m, int32_t d, float eps, void* y) = 0;
  // The residual add fused in: x[m, d] += delta[m, d], then y = RmsNorm(x) * w.
  virtual void AddRmsNorm(void* x, const void* delta, const void* w, int32_t m, int32_t d,
                          float eps, void* y) = 0;
  // Rotates x[m, num_heads, head_dim] in place at positions[m].
  virtual void Rope(void* x, const int32_t* positions, int32_t m, int32_t num_heads,
                    const RopeParams& p) = 0;
  // out[n] = silu(gate[n]) * up[n].
  virtual void SiluMul(const void* gate, const void* up, int64_t n, void* out) = 0;
  // x[n] += y[n].
  virtual void Add(void* x, const void* y, int64_t n) = 0;
  // out[m, d] = table[ids[m], d].
  virtual void EmbeddingGather(const void* table, int32_t d, const int32_t* ids, int32_t m,
                               void* out) = 0;
  // Writes k/v[num_tokens, num_kv_heads, head_dim] into the pool at meta.slot_mapping.
  virtual void KvWrite(const PagedKvLayer& kv, const void* k, const void* v,
                       const AttentionMetadata& meta) = 0;
  // out[num_tokens, num_heads, head_dim] = softmax(q k^T * scale) v over each token's causal
  // context, with GQA (num_heads a multiple of kv.num_kv_heads).
  virtual void PagedAttention(const void* q, const PagedKvLayer& kv,
                              const AttentionMetadata& meta, int32_t num_heads, float scale,
                              void* out) = 0;
  // Copies whole blocks src[i] -> dst[i] (K and V) within one layer's pool (copy-on-write).
  virtual void CopyKvBlocks(const PagedKvLayer& kv, const int32_t* src, const int32_t* dst,
                            int32_t n) = 0;
  // tokens[m]: each row's argmax (lowest index on ties), without a processed distribution.
  virtual void Argmax(const float* logits, int32_t m, int32_t vocab, int32_t* tokens) = 0;
  // tokens[m] from logits[m, vocab] after temperature, top-k and top-p; probs[m, vocab] (may be
  // null) receives the processed distribution (one-hot when greedy).
  virtual void Sample(const float* logits, int32_t m, int32_t vocab, const SampleArgs& args,
                      float* probs, int32_t* tokens) = 0;
  // Accept / recover / bonus for every sequence (see VerifyArgs).
  virtual void VerifyDrafts(const VerifyArgs& args) = 0;
};

// A growable buffer in a backend's memory. Grow() keeps nothing of the old contents.
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { Reset(); }

  // Makes room for `bytes`; *moved (if given) is set when the address changed. `scattered`: the
  // memory comes from AllocScattered.
  absl::Status Grow(Backend* be, size_t bytes, bool* moved = nullptr, bool scattered = false) {
    if (moved != nullptr) *moved = false;
    if (bytes <= bytes_ && be == be_) return absl::OkStatus();
    Reset();
    auto p = scattered ? be->AllocScattered(bytes) : be->Alloc(bytes);
    if (!p.ok()) return p.status();
    be_ = be;
    p_ = *p;
    bytes_ = bytes;
    if (moved != nullptr) *moved = true;
    return absl::OkStatus();
  }
  void Reset() {
    if (p_ != nullptr) be_->Free(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  Backend* be_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace specula

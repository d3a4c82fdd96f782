// The op interface every backend implements. The model is written once against it; the CPU backend
// (kernels/cpu/) is the reference that every faster backend is tested against.
//
// All tensors are row-major float32 host or device pointers owned by the caller. Shapes are given
// in brackets beside each argument.
#pragma once

#include <cstdint>

namespace specula {

// One layer's slice of the paged KV pool. Block b, slot s of head h lives at
// k[((b * block_size + s) * num_kv_heads + h) * head_dim].
struct PagedKvLayer {
  float* k = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim]
  float* v = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim]
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

// Where every new token of a batch sits. A token at position p attends to positions [0, p] of its
// own sequence (causal among the new tokens too), read through the sequence's block table.
struct AttentionMetadata {
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  const int32_t* query_start = nullptr;   // [num_seqs + 1] token offsets of each sequence
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* slot_mapping = nullptr;  // [num_tokens] block_id * block_size + offset
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq], padded with -1
  int32_t max_blocks_per_seq = 0;
};

struct RopeParams {
  int32_t head_dim = 0;
  // true: rotate adjacent pairs (2i, 2i+1) as llama2.c and GGUF do;
  // false: rotate halves (i, i + head_dim/2) as HF checkpoints do.
  bool interleaved = false;
  // [max_positions, head_dim]: per position, cos of the head_dim/2 pair angles, then their sin
  // (rope_theta and scaling applied). Built once per model, as vLLM's cos_sin_cache.
  const float* cos_sin = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // y[m, n] = x[m, k] * w[n, k]^T + bias[n] (bias may be null).
  virtual void Linear(const float* x, const float* w, const float* bias, int32_t m, int32_t n,
                      int32_t k, float* y) = 0;
  // Several products of the same input in one call (Q/K/V, gate/up), so a backend can run them in
  // one parallel pass: outs[i].y[m, outs[i].n] = x[m, k] * outs[i].w[n, k]^T + outs[i].bias.
  struct LinearOut {
    const float* w;
    const float* bias;  // may be null
    int32_t n;
    float* y;
  };
  virtual void MultiLinear(const float* x, int32_t m, int32_t k, const LinearOut* outs,
                           int32_t num_outs) = 0;
  // y[m, d] = x[m, d] / rms(x) * w[d]. In-place (y == x) is allowed.
  virtual void RmsNorm(const float* x, const float* w, int32_t m, int32_t d, float eps,
                       float* y) = 0;
  // Rotates x[m, num_heads, head_dim] in place at positions[m].
  virtual void Rope(float* x, const int32_t* positions, int32_t m, int32_t num_heads,
                    const RopeParams& p) = 0;
  // out[n] = silu(gate[n]) * up[n].
  virtual void SiluMul(const float* gate, const float* up, int64_t n, float* out) = 0;
  // x[n] += y[n].
  virtual void Add(float* x, const float* y, int64_t n) = 0;
  // out[m, d] = table[ids[m], d].
  virtual void EmbeddingGather(const float* table, int32_t d, const int32_t* ids, int32_t m,
                               float* out) = 0;
  // Writes k/v[num_tokens, num_kv_heads, head_dim] into the pool at meta.slot_mapping.
  virtual void KvWrite(const PagedKvLayer& kv, const float* k, const float* v,
                       const AttentionMetadata& meta) = 0;
  // out[num_tokens, num_heads, head_dim] = softmax(q k^T * scale) v over each token's causal
  // context, with GQA (num_heads a multiple of kv.num_kv_heads).
  virtual void PagedAttention(const float* q, const PagedKvLayer& kv,
                              const AttentionMetadata& meta, int32_t num_heads, float scale,
                              float* out) = 0;
};

}  // namespace specula

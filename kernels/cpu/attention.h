// The CPU backend's KV storage and paged attention, for pools of float32 or bf16 elements
// (--kv-cache-dtype). Activations stay float32: KV rows are converted once when written, and bf16
// keys and values are widened in registers as attention reads them, so a bf16 pool moves half the
// bytes of a float32 one. One SIMD kernel serves AVX-512 (16 lanes) and AVX2 (8 lanes).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace specula::cpu {

// The CPU pool's layout within a block: [num_kv_heads, block_size, head_dim], so that a KV head's
// slots in a block are one contiguous run, which the attention kernel reads in order. The element
// offset of slot `s` of KV head `h` in block `b`.
inline int64_t KvOffset(const PagedKvLayer& kv, int64_t b, int32_t h, int32_t s) {
  return ((b * kv.num_kv_heads + h) * kv.block_size + s) * kv.head_dim;
}

// True for the pool element types below: f32 and bf16.
bool CpuKvDtype(DType d);

// Writes k/v[num_tokens, num_kv_heads, head_dim] (float32) into the pool at meta.slot_mapping
// (KvOffset), converting to kv.dtype; slots of -1 (padding) are skipped.
void WriteKv(const PagedKvLayer& kv, const float* k, const float* v, const AttentionMetadata& meta);

// Copies whole blocks src[i] -> dst[i], K and V.
void CopyKvBlocks(const PagedKvLayer& kv, const int32_t* src, const int32_t* dst, int32_t n);

// out[num_tokens, num_heads, head_dim] = softmax(q k^T * scale) v over each token's causal context,
// through one SIMD kernel, up to 8 tokens of a sequence together (prefill chunks included: OpenBLAS's
// GEMMs, used here before, fell back to their SSE3 kernels on CPUs that OpenBLAS 0.3.21 does not
// know, and were a sixth of a batched run). A token's output is the same bits in every grouping.
// Holds scratch between calls, so one instance per backend.
class PagedAttention {
 public:
  void Run(const float* q, const PagedKvLayer& kv, const AttentionMetadata& meta, int32_t num_heads, float scale,
           float* out);

 private:
  template <typename T>
  void RunTyped(const float* q, const PagedKvLayer& kv, const AttentionMetadata& meta, int32_t num_heads,
                float scale, float* out);

  std::vector<std::array<int32_t, 3>> items_;  // (first token, tokens, sequence) of the step
};

}  // namespace specula::cpu

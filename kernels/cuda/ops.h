// Host entry points of the CUDA kernels: one InvokeXxx per kernel family, each enqueued on a
// stream. Tensors are device pointers; `dtype` picks the element type of the `void*` ones.
// Internal to kernels/cuda/ (CUDA types stay here).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"

namespace specula::cuda {

// dst[n] (dtype) = src[n] (float32).
void InvokeConvertFromF32(DType dtype, const float* src, int64_t n, void* dst, cudaStream_t s);
// y[m, n] += bias[n].
void InvokeAddBias(DType dtype, void* y, const void* bias, int32_t m, int32_t n, cudaStream_t s);
void InvokeRmsNorm(DType dtype, const void* x, const void* w, int32_t m, int32_t d, float eps, void* y,
                   cudaStream_t s);
void InvokeAddRmsNorm(DType dtype, void* x, const void* delta, const void* w, int32_t m, int32_t d,
                      float eps, void* y, cudaStream_t s);
void InvokeRope(DType dtype, void* x, const int32_t* positions, int32_t m, int32_t num_heads,
                const RopeParams& p, cudaStream_t s);
void InvokeSiluMul(DType dtype, const void* gate, const void* up, int64_t n, void* out, cudaStream_t s);
void InvokeAdd(DType dtype, void* x, const void* y, int64_t n, cudaStream_t s);
void InvokeEmbeddingGather(DType dtype, const void* table, int32_t d, const int32_t* ids, int32_t m,
                           void* out, cudaStream_t s);
void InvokeKvWrite(DType dtype, const PagedKvLayer& kv, const void* k, const void* v,
                   const AttentionMetadata& meta, cudaStream_t s);
void InvokeCopyKvBlocks(DType dtype, const PagedKvLayer& kv, const int32_t* src, const int32_t* dst,
                        int32_t n, cudaStream_t s);
// partials: scratch for split-K over the context, [partial_rows, PagedAttentionPartialFloats(1)]
// floats; null runs one split per (token, head).
void InvokePagedAttention(DType dtype, const void* q, const PagedKvLayer& kv, const AttentionMetadata& meta,
                          int32_t num_heads, float scale, void* out, float* partials, int32_t partial_rows,
                          cudaStream_t s);
int64_t PagedAttentionPartialFloats(int32_t partial_rows);
// y[m, n] = x[m, k] w[n, k]^T for m <= kMaxGemvRows (decode), in dtype, y in dtype or float32.
// Only where GemvApplies (k a whole number of 16-byte vectors, x and w 16-byte aligned).
// Several products of the same x (1 <= num_outs <= kMaxGemvOuts) run in one launch.
constexpr int32_t kMaxGemvRows = 4;
constexpr int32_t kMaxGemvOuts = 3;
struct GemvOut {
  const void* w;  // [n, k]
  void* y;        // [m, n]
  int32_t n;
};
bool GemvApplies(DType dtype, const void* x, const void* w, int32_t m, int32_t k);
void InvokeGemv(DType dtype, const void* x, int32_t m, int32_t k, const GemvOut* outs, int32_t num_outs, bool out_f32,
                cudaStream_t s);
int MultiprocessorCount();
// tokens[m]: the argmax of each row of logits [m, vocab], lowest index on ties.
void InvokeArgmax(const float* logits, int32_t m, int32_t vocab, int32_t* tokens, cudaStream_t s);
// probs: [m, vocab] f32 scratch, required (the caller's buffer or the backend's).
void InvokeSample(const float* logits, int32_t m, int32_t vocab, const SampleArgs& args, float* probs,
                  int32_t* tokens, cudaStream_t s);
void InvokeVerifyDrafts(const VerifyArgs& args, cudaStream_t s);

}  // namespace specula::cuda

// Paged attention for any number of new tokens per sequence (decode, prefill chunks, speculative
// verification): causal among the new tokens, K/V read through block tables, GQA.
//
// One block per (token, head), kWarps warps. Each warp takes every kWarps-th context position and
// keeps an online softmax (running max, sum and weighted V in registers, head_dim/32 values per
// lane); the warps merge through shared memory at the end. Accumulation is float32.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace specula::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;

template <typename T>
__global__ void PagedAttentionKernel(const T* q, const T* kc, const T* vc, int32_t block_size, int32_t num_kv_heads,
                                     int32_t hd, const int32_t* query_start, int32_t num_seqs,
                                     const int32_t* positions, const int32_t* block_tables, int32_t max_blocks,
                                     int32_t num_heads, float scale, T* out) {
  const int32_t t = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // The sequence of token t: the last s with query_start[s] <= t.
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int32_t* table = block_tables + int64_t{lo} * max_blocks;
  const int32_t ctx = positions[t] + 1;
  const int32_t kvh = h / (num_heads / num_kv_heads);
  const int64_t row = int64_t{num_kv_heads} * hd;

  float qv[kPerLane], acc[kPerLane];
  const T* qh = q + (int64_t{t} * num_heads + h) * hd;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int j = lane + 32 * i;
    qv[i] = j < hd ? ToF32(qh[j]) * scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int32_t p = warp; p < ctx; p += kWarps) {
    const int32_t block = table[p / block_size];
    if (block < 0) continue;  // padding sequence: nothing cached
    const int64_t base = (int64_t{block} * block_size + p % block_size) * row + int64_t{kvh} * hd;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int j = lane + 32 * i;
      if (j < hd) dot += qv[i] * ToF32(kc[base + j]);
    }
    const float score = WarpSum(dot);
    const float m_new = fmaxf(m, score);
    const float correction = __expf(m - m_new), w = __expf(score - m_new);
    l = l * correction + w;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int j = lane + 32 * i;
      acc[i] = acc[i] * correction + (j < hd ? w * ToF32(vc[base + j]) : 0.0f);
    }
    m = m_new;
  }

  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxHeadDim];
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int j = lane + 32 * i;
    if (j < hd) s_acc[warp][j] = acc[i];
  }
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, s_m[w]);
  float l_all = 0.0f, f[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    f[w] = s_l[w] > 0.0f ? __expf(s_m[w] - m_all) : 0.0f;
    l_all += s_l[w] * f[w];
  }
  T* oh = out + (int64_t{t} * num_heads + h) * hd;
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += s_acc[w][j] * f[w];
    oh[j] = FromF32<T>(l_all > 0.0f ? o / l_all : 0.0f);
  }
}

}  // namespace

void InvokePagedAttention(DType dtype, const void* q, const PagedKvLayer& kv, const AttentionMetadata& meta,
                          int32_t num_heads, float scale, void* out, cudaStream_t s) {
  if (meta.num_tokens == 0) return;
  const dim3 grid(meta.num_tokens, num_heads);
  DispatchDType(dtype, [&]<typename T>() {
    PagedAttentionKernel<T><<<grid, kWarps * 32, 0, s>>>(
        static_cast<const T*>(q), static_cast<const T*>(kv.k), static_cast<const T*>(kv.v), kv.block_size,
        kv.num_kv_heads, kv.head_dim, meta.query_start, meta.num_seqs, meta.positions, meta.block_tables,
        meta.max_blocks_per_seq, num_heads, scale, static_cast<T*>(out));
  });
}

}  // namespace specula::cuda

// Paged attention for any number of new tokens per sequence (decode, prefill chunks, speculative
// verification): causal among the new tokens, K/V read through block tables, GQA.
//
// One block per (token, head, split), kWarps warps. A split is a contiguous share of the token's
// context (split-K, "flash decoding"): at batch 1 there are only num_heads (token, head) pairs, far
// fewer than the GPU has multiprocessors, so each pair's context is cut in up to kMaxSplits
// pieces, decided on the host from the pair count alone (a captured graph stays valid at any
// context length). Each warp takes every kWarps-th position of its split and keeps an online
// softmax (running max, sum and weighted V in registers, head_dim/32 values per lane); the warps
// merge through shared memory. With one split the block writes the output; with several it writes
// (max, sum, unnormalized V sum) to `partials`, and MergeSplitsKernel combines them.
// Accumulation is float32.
#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace specula::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;
constexpr int kMaxSplits = 32;
constexpr int kPartialFloats = kMaxHeadDim + 2;  // one split's (max, sum, acc[head_dim])

// The sequence of token t: the last s with query_start[s] <= t.
__device__ __forceinline__ int SequenceOf(const int32_t* query_start, int32_t num_seqs, int32_t t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One warp's online softmax over its positions of the split [begin, end), every kWarps-th from
// begin + warp: the running max m, the sum l of e^(score - m), and acc, the weighted V sum of the
// lane's values (qv: the lane's query values, scaled). K and V rows are `row` elements apart, the
// KV head's hd values at kvh * hd.
template <typename T>
__device__ __forceinline__ void WarpOnlineSoftmax(const float (&qv)[kPerLane], const T* kc, const T* vc,
                                                  const int32_t* table, int32_t block_size, int64_t row, int32_t kvh,
                                                  int32_t hd, int32_t begin, int32_t end, int lane, int warp, float& m,
                                                  float& l, float (&acc)[kPerLane]) {
  for (int32_t p = begin + warp; p < end; p += kWarps) {
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
}

template <typename T>
__global__ void PagedAttentionKernel(const T* q, const T* kc, const T* vc, int32_t block_size, int32_t num_kv_heads,
                                     int32_t hd, const int32_t* query_start, int32_t num_seqs,
                                     const int32_t* positions, const int32_t* block_tables, int32_t max_blocks,
                                     int32_t num_heads, float scale, T* out, float* partials) {
  const int32_t t = blockIdx.x, h = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t* table = block_tables + int64_t{SequenceOf(query_start, num_seqs, t)} * max_blocks;
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
  const int32_t chunk = (ctx + splits - 1) / splits, begin = split * chunk, end = min(ctx, begin + chunk);
  float m = -INFINITY, l = 0.0f;
  WarpOnlineSoftmax(qv, kc, vc, table, block_size, row, kvh, hd, begin, end, lane, warp, m, l, acc);

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
  if (splits == 1) {
    T* oh = out + (int64_t{t} * num_heads + h) * hd;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
      float o = 0.0f;
      for (int w = 0; w < kWarps; ++w) o += s_acc[w][j] * f[w];
      oh[j] = FromF32<T>(l_all > 0.0f ? o / l_all : 0.0f);
    }
    return;
  }
  float* part = partials + ((int64_t{t} * num_heads + h) * splits + split) * kPartialFloats;
  if (threadIdx.x == 0) {
    part[0] = m_all;  // -inf for an empty split (l_all = 0)
    part[1] = l_all;
  }
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += s_acc[w][j] * f[w];
    part[2 + j] = o;
  }
}

// One block per (token, head): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
template <typename T>
__global__ void MergeSplitsKernel(const float* partials, int32_t splits, int32_t hd, int32_t num_heads, T* out) {
  const int32_t t = blockIdx.x, h = blockIdx.y;
  const float* part = partials + (int64_t{t} * num_heads + h) * splits * kPartialFloats;
  float m_all = -INFINITY;
  for (int s = 0; s < splits; ++s) {
    if (part[s * kPartialFloats + 1] > 0.0f) m_all = fmaxf(m_all, part[s * kPartialFloats]);
  }
  float l_all = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float l = part[s * kPartialFloats + 1];
    if (l > 0.0f) l_all += l * __expf(part[s * kPartialFloats] - m_all);
  }
  T* oh = out + (int64_t{t} * num_heads + h) * hd;
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float l = part[s * kPartialFloats + 1];
      if (l > 0.0f) o += part[s * kPartialFloats + 2 + j] * __expf(part[s * kPartialFloats] - m_all);
    }
    oh[j] = FromF32<T>(l_all > 0.0f ? o / l_all : 0.0f);
  }
}

}  // namespace

int MultiprocessorCount() {
  static const int count = [] {
    int device = 0, n = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return 1;
    }
    return n;
  }();
  return count;
}

int64_t PagedAttentionPartialFloats(int32_t max_splits_total) { return int64_t{max_splits_total} * kPartialFloats; }

static int32_t PagedAttentionSplits(int32_t num_tokens, int32_t num_heads, int32_t partial_rows) {
  // Eight blocks per multiprocessor, within the partials buffer: each warp walks its positions one
  // dependent load chain (table, K, V) at a time, so short shares keep more chains in flight (at
  // two blocks per multiprocessor the llama-3.2-1b batch-1 step spent 20 us per layer here).
  // SPECULA_CUDA_ATTN_BLOCKS_PER_SM (1..8) overrides the eight, for side-by-side measurements.
  static const int64_t per_sm = [] {
    const char* env = std::getenv("SPECULA_CUDA_ATTN_BLOCKS_PER_SM");
    return env != nullptr ? std::clamp<int64_t>(std::atoi(env), 1, 8) : int64_t{8};
  }();
  const int64_t pairs = int64_t{num_tokens} * num_heads;
  int64_t splits = std::min<int64_t>(kMaxSplits, (per_sm * MultiprocessorCount() + pairs - 1) / pairs);
  splits = std::min<int64_t>(splits, partial_rows / pairs);
  return static_cast<int32_t>(std::max<int64_t>(splits, 1));
}

void InvokePagedAttention(DType dtype, const void* q, const PagedKvLayer& kv, const AttentionMetadata& meta,
                          int32_t num_heads, float scale, void* out, float* partials, int32_t partial_rows,
                          cudaStream_t s) {
  if (meta.num_tokens == 0) return;
  const int32_t splits = partials != nullptr ? PagedAttentionSplits(meta.num_tokens, num_heads, partial_rows) : 1;
  const dim3 grid(meta.num_tokens, num_heads, splits);
  DispatchDType(dtype, [&]<typename T>() {
    PagedAttentionKernel<T><<<grid, kWarps * 32, 0, s>>>(
        static_cast<const T*>(q), static_cast<const T*>(kv.k), static_cast<const T*>(kv.v), kv.block_size,
        kv.num_kv_heads, kv.head_dim, meta.query_start, meta.num_seqs, meta.positions, meta.block_tables,
        meta.max_blocks_per_seq, num_heads, scale, static_cast<T*>(out), partials);
    if (splits > 1) {
      MergeSplitsKernel<T><<<dim3(meta.num_tokens, num_heads), 64, 0, s>>>(partials, splits, kv.head_dim, num_heads,
                                                                          static_cast<T*>(out));
    }
  });
}

}  // namespace specula::cuda

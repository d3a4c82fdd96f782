// Logits processing and sampling (temperature, top-k, top-p, greedy) and the rejection-sampling
// verification step, one block per row. The rules and the order of operations follow the CPU
// references in kernels/cpu/sampling.cc; top-k and top-p thresholds are found exactly by a
// bitwise search over order-preserving float keys (32 counting passes), with no sort.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace specula::cuda {
namespace {

constexpr int kThreads = 1024;

// Monotonic map of floats to unsigned keys: a < b <=> Key(a) < Key(b).
__device__ __forceinline__ uint32_t Key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Inverse-CDF draw over weights w(i) >= 0, i in [0, n), in index order, with u in [0, 1): the
// first i whose running sum exceeds u * total, zero weights skipped (SampleCategorical). Every
// thread of the block must call it; all get the index.
template <typename W>
__device__ int32_t BlockSample(W w, int32_t n, double u) {
  __shared__ double s_chunk[kThreads];
  __shared__ int32_t s_pick;
  const int32_t chunk = (n + blockDim.x - 1) / blockDim.x;
  const int32_t beg = threadIdx.x * chunk, end = min(n, beg + chunk);
  double sum = 0.0;
  for (int32_t i = beg; i < end; ++i) sum += w(i);
  s_chunk[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int c = 0; c < blockDim.x; ++c) total += s_chunk[c];
    const double target = u * total;
    double cdf = 0.0;
    int32_t pick = -1, last = 0;
    for (int c = 0; c < blockDim.x && pick < 0; ++c) {
      if (s_chunk[c] <= 0.0) continue;
      const int32_t b = c * chunk, e = min(n, b + chunk);
      if (cdf + s_chunk[c] <= target) {  // the draw lies past this chunk
        cdf += s_chunk[c];
        for (int32_t i = e - 1; i >= b; --i) {
          if (w(i) > 0.0f) { last = i; break; }
        }
        continue;
      }
      for (int32_t i = b; i < e; ++i) {
        const float wi = w(i);
        if (wi <= 0.0f) continue;
        cdf += wi;
        last = i;
        if (target < cdf) { pick = i; break; }
      }
    }
    s_pick = pick >= 0 ? pick : last;  // rounding: u landed past the accumulated mass
  }
  __syncthreads();
  return s_pick;
}

// The row's argmax, lowest index on ties; every thread of the block gets it. Reads the row once,
// four floats at a time where the row is 16-byte aligned.
__device__ int32_t BlockArgmax(const float* row, int32_t V) {
  __shared__ float s_v[32];
  __shared__ int32_t s_i[32];
  float best = -INFINITY;
  int32_t idx = 0x7fffffff;
  auto take = [&](float v, int32_t i) {
    if (v > best || (v == best && i < idx)) { best = v; idx = i; }
  };
  int32_t head = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    const int32_t vecs = V / 4;
    const float4* r4 = reinterpret_cast<const float4*>(row);
    for (int32_t j = threadIdx.x; j < vecs; j += blockDim.x) {
      const float4 v = r4[j];
      take(v.x, 4 * j);
      take(v.y, 4 * j + 1);
      take(v.z, 4 * j + 2);
      take(v.w, 4 * j + 3);
    }
    head = vecs * 4;
  }
  for (int32_t i = head + threadIdx.x; i < V; i += blockDim.x) take(row[i], i);
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    take(ob, oi);
  }
  if ((threadIdx.x & 31) == 0) { s_v[threadIdx.x >> 5] = best; s_i[threadIdx.x >> 5] = idx; }
  __syncthreads();
  best = s_v[0];
  idx = s_i[0];
  for (int wi = 1; wi < (blockDim.x >> 5); ++wi) take(s_v[wi], s_i[wi]);
  __syncthreads();  // s_v and s_i are reused by the next call
  return idx;
}

// probs[vocab] <- the processed distribution of one row; returns nothing (probs is written).
__device__ void ProcessRow(const float* logits, int32_t V, float temperature, int32_t top_k, float top_p,
                           float* probs) {
  if (!(temperature > 0.0f)) {  // greedy: one-hot at the argmax, lowest index on ties
    const int32_t idx = BlockArgmax(logits, V);
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) probs[i] = i == idx ? 1.0f : 0.0f;
    __syncthreads();
    return;
  }
  uint32_t cutoff = 0;  // keys below are dropped (top-k)
  if (top_k > 0 && top_k < V) {
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = cutoff | (1u << bit);
      int32_t count = 0;
      for (int32_t i = threadIdx.x; i < V; i += blockDim.x) count += Key(logits[i]) >= cand;
      if (BlockSum(count) >= top_k) cutoff = cand;
    }
  }
  float mx = -INFINITY;
  for (int32_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, logits[i]);
  mx = BlockMax(mx);
  double sum = 0.0;
  for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float p = Key(logits[i]) >= cutoff ? expf((logits[i] - mx) / temperature) : 0.0f;
    probs[i] = p;
    sum += p;
  }
  sum = BlockSum(sum);
  if (top_p < 1.0f) {
    // The largest threshold whose kept mass (p >= threshold) still reaches top_p * sum.
    uint32_t keep = 0;  // non-negative floats order like their bits
    for (int bit = 30; bit >= 0; --bit) {
      const uint32_t cand = keep | (1u << bit);
      double mass = 0.0;
      for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        if (__float_as_uint(probs[i]) >= cand) mass += probs[i];
      }
      if (BlockSum(mass) >= top_p * sum) keep = cand;
    }
    double kept = 0.0;
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
      if (__float_as_uint(probs[i]) < keep) probs[i] = 0.0f;
      kept += probs[i];
    }
    sum = BlockSum(kept);
  }
  for (int32_t i = threadIdx.x; i < V; i += blockDim.x) probs[i] = static_cast<float>(probs[i] / sum);
  __syncthreads();
}

__global__ void SampleKernel(const float* logits, int32_t V, SampleArgs args, float* probs, int32_t* tokens) {
  const int32_t r = blockIdx.x;
  float* p = probs + (args.probs_row != nullptr ? int64_t{args.probs_row[r]} : int64_t{r}) * V;
  ProcessRow(logits + int64_t{r} * V, V, args.temperature[r], args.top_k[r], args.top_p[r], p);
  const int32_t token = BlockSample([&](int32_t i) { return p[i]; }, V, args.uniform[r]);
  if (threadIdx.x == 0) tokens[r] = token;
}

__global__ void ArgmaxKernel(const float* logits, int32_t V, int32_t* tokens) {
  const int32_t token = BlockArgmax(logits + int64_t{blockIdx.x} * V, V);
  if (threadIdx.x == 0) tokens[blockIdx.x] = token;
}

__global__ void VerifyKernel(VerifyArgs a) {
  const int32_t s = blockIdx.x, k = a.k, V = a.vocab, n = a.num_drafts[s];
  const int64_t t_row = a.target_row != nullptr ? a.target_row[s] : int64_t{s} * (k + 1);
  const int64_t d_row = a.draft_row != nullptr ? a.draft_row[s] : int64_t{s} * k;
  const float* target = a.target_probs + t_row * V;
  const float* q_rows = a.draft_probs != nullptr ? a.draft_probs + d_row * V : nullptr;
  int32_t* out = a.tokens + int64_t{s} * (k + 1);
  const double u_final = a.uniform_final[s];
  for (int32_t i = 0; i < n; ++i) {  // the same branch in every thread
    const float* p = target + int64_t{i} * V;
    const int32_t x = a.draft[int64_t{s} * k + i];
    const float q_x = q_rows != nullptr ? q_rows[int64_t{i} * V + x] : 1.0f;
    const double accept = q_x > 0.0f ? fmin(1.0, static_cast<double>(p[x]) / q_x) : 0.0;
    if (a.uniform_accept[int64_t{s} * k + i] < accept) {
      if (threadIdx.x == 0) out[i] = x;  // accepted
      continue;
    }
    const float* q = q_rows != nullptr ? q_rows + int64_t{i} * V : nullptr;
    auto residual = [&](int32_t v) {
      const float q_v = q != nullptr ? q[v] : (v == x ? 1.0f : 0.0f);
      return fmaxf(0.0f, p[v] - q_v);
    };
    double mass = 0.0;
    for (int32_t v = threadIdx.x; v < V; v += blockDim.x) mass += residual(v);
    mass = BlockSum(mass);
    // p == q up to rounding leaves no residual mass; p itself is then the right distribution.
    const int32_t token = mass > 0.0 ? BlockSample(residual, V, u_final)
                                     : BlockSample([&](int32_t v) { return p[v]; }, V, u_final);
    if (threadIdx.x == 0) {
      out[i] = token;  // recovered
      a.num_accepted[s] = i;
    }
    return;
  }
  const float* bonus = target + int64_t{n} * V;
  const int32_t token = BlockSample([&](int32_t v) { return bonus[v]; }, V, u_final);
  if (threadIdx.x == 0) {
    out[n] = token;
    a.num_accepted[s] = n;
  }
}

}  // namespace

void InvokeSample(const float* logits, int32_t m, int32_t vocab, const SampleArgs& args, float* probs,
                  int32_t* tokens, cudaStream_t s) {
  if (m == 0) return;
  SampleKernel<<<m, kThreads, 0, s>>>(logits, vocab, args, probs, tokens);
}

void InvokeArgmax(const float* logits, int32_t m, int32_t vocab, int32_t* tokens, cudaStream_t s) {
  if (m == 0) return;
  ArgmaxKernel<<<m, kThreads, 0, s>>>(logits, vocab, tokens);
}

void InvokeVerifyDrafts(const VerifyArgs& args, cudaStream_t s) {
  if (args.num_seqs == 0) return;
  VerifyKernel<<<args.num_seqs, kThreads, 0, s>>>(args);
}

}  // namespace specula::cuda

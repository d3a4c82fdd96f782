// Matrix-vector products for decode: y[m, n] = x[m, k] w[n, k]^T with m <= kMaxGemvRows. At batch 1
// a decode step reads every weight once, and cuBLAS's kernels for m = 1 reached about half the
// memory bandwidth on the llama-3.2-1b shapes (H100, ncu). Here one warp computes one output
// column for all m rows, streaming its weight row with 16-byte loads (several in flight per lane);
// x is small and stays in L1/L2. float32 accumulation, one warp reduction at the end.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace specula::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// The two 16-bit elements of a 32-bit word as floats.
template <typename T>
__device__ __forceinline__ float2 Pair(uint32_t u);
template <>
__device__ __forceinline__ float2 Pair<__nv_bfloat16>(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 Pair<__half>(uint32_t u) {
  __half2 h;
  static_assert(sizeof(h) == sizeof(u));
  memcpy(&h, &u, sizeof(u));
  return __half22float2(h);
}

// Dot product of two 16-byte vectors of T (16-bit types; float below).
template <typename T>
__device__ __forceinline__ float Dot16(const uint4& a, const uint4& b) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = Pair<T>(wa[i]), q = Pair<T>(wb[i]);
    s = fmaf(p.x, q.x, s);
    s = fmaf(p.y, q.y, s);
  }
  return s;
}
template <>
__device__ __forceinline__ float Dot16<float>(const uint4& a, const uint4& b) {
  float s = __uint_as_float(a.x) * __uint_as_float(b.x);
  s = fmaf(__uint_as_float(a.y), __uint_as_float(b.y), s);
  s = fmaf(__uint_as_float(a.z), __uint_as_float(b.z), s);
  return fmaf(__uint_as_float(a.w), __uint_as_float(b.w), s);
}

// Up to three products of the same x in one launch (q, k, v; gate, up): blocks [0, first1) make
// output 0, [first1, first2) output 1, the rest output 2. Scalar parameters selected with
// conditionals: a version that indexed parameter arrays by the output's number took 2.15 ms per
// llama-3.2-1b batch-1 step on the H100 instead of 1.72.
struct GemvArgs {
  const void *w0, *w1, *w2;
  void *y0, *y1, *y2;
  int32_t n0, n1, n2;
  int32_t first1, first2;
};

// One warp per output column; M rows of x. k is a multiple of 16 / sizeof(T); x and every w
// 16-byte aligned (checked by the caller).
template <typename T, typename OutT, int M>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) GemvKernel(const T* __restrict__ x, int32_t k, GemvArgs a) {
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte load
  const int lane = threadIdx.x & 31;
  const int32_t b = blockIdx.x;
  const bool in0 = b < a.first1, in1 = !in0 && b < a.first2;
  const int32_t n = in0 ? a.n0 : in1 ? a.n1 : a.n2;
  const int32_t col = (b - (in0 ? 0 : in1 ? a.first1 : a.first2)) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (col >= n) return;
  OutT* __restrict__ y = static_cast<OutT*>(in0 ? a.y0 : in1 ? a.y1 : a.y2);
  const T* __restrict__ w = static_cast<const T*>(in0 ? a.w0 : in1 ? a.w1 : a.w2);
  const uint4* wr = reinterpret_cast<const uint4*>(w + int64_t{col} * k);
  const int32_t vecs = k / V;  // 16-byte vectors per row
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
#pragma unroll 4
  for (int32_t i = lane; i < vecs; i += 32) {
    const uint4 wv = __ldg(wr + i);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + int64_t{r} * k) + i);
      acc[r] += Dot16<T>(wv, xv);
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = WarpSum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < M; ++r) y[int64_t{r} * n + col] = FromF32<OutT>(acc[r]);
  }
}

template <typename T, typename OutT>
void Launch(const T* x, int32_t m, int32_t k, const GemvArgs& outs, int blocks, cudaStream_t s) {
  const int threads = kWarpsPerBlock * 32;
  switch (m) {
    case 1: GemvKernel<T, OutT, 1><<<blocks, threads, 0, s>>>(x, k, outs); break;
    case 2: GemvKernel<T, OutT, 2><<<blocks, threads, 0, s>>>(x, k, outs); break;
    case 3: GemvKernel<T, OutT, 3><<<blocks, threads, 0, s>>>(x, k, outs); break;
    case 4: GemvKernel<T, OutT, 4><<<blocks, threads, 0, s>>>(x, k, outs); break;
  }
}

}  // namespace

bool GemvApplies(DType dtype, const void* x, const void* w, int32_t m, int32_t k) {
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  return m >= 1 && m <= kMaxGemvRows && k % (16 / DTypeBytes(dtype)) == 0 && !misaligned(x) && !misaligned(w);
}

void InvokeGemv(DType dtype, const void* x, int32_t m, int32_t k, const GemvOut* outs, int32_t num_outs, bool out_f32,
                cudaStream_t s) {
  int32_t blocks[kMaxGemvOuts] = {0, 0, 0};
  for (int32_t i = 0; i < num_outs; ++i) blocks[i] = CeilDiv(outs[i].n, kWarpsPerBlock);
  const GemvOut none{nullptr, nullptr, 0};
  const GemvOut& o1 = num_outs > 1 ? outs[1] : none;
  const GemvOut& o2 = num_outs > 2 ? outs[2] : none;
  const GemvArgs a{outs[0].w, o1.w, o2.w, outs[0].y, o1.y, o2.y, outs[0].n, o1.n, o2.n,
                   blocks[0], blocks[0] + blocks[1]};
  const int total = blocks[0] + blocks[1] + blocks[2];
  DispatchDType(dtype, [&]<typename T>() {
    if (out_f32) {
      Launch<T, float>(static_cast<const T*>(x), m, k, a, total, s);
    } else {
      Launch<T, T>(static_cast<const T*>(x), m, k, a, total, s);
    }
  });
}

}  // namespace specula::cuda

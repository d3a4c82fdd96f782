// Element-type helpers and block reductions shared by the kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"

namespace specula::cuda {

__device__ __forceinline__ float ToF32(float x) { return x; }
__device__ __forceinline__ float ToF32(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToF32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromF32(float x);
template <>
__device__ __forceinline__ float FromF32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half FromF32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Calls f.template operator()<T>() with T the element type of `dtype`.
template <typename F>
void DispatchDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f.template operator()<float>(); break;
    case DType::kF16: f.template operator()<__half>(); break;
    case DType::kBF16: f.template operator()<__nv_bfloat16>(); break;
  }
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <typename T>
__device__ T BlockSum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = 0;
  const int warps = (blockDim.x + 31) >> 5;
  for (int i = 0; i < warps; ++i) total += partial[i];
  return total;
}

__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  const int warps = (blockDim.x + 31) >> 5;
  for (int i = 0; i < warps; ++i) m = fmaxf(m, partial[i]);
  return m;
}

inline int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace specula::cuda

// Row and element kernels: conversion, bias, RMSNorm (with the residual add fused in), RoPE,
// SiLU-and-multiply, add, embedding gather, KV write and KV block copy.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

template <typename T>
__global__ void ConvertKernel(const float* src, int64_t n, T* dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = FromF32<T>(src[i]);
  }
}

template <typename T>
__global__ void AddBiasKernel(T* y, const T* bias, int32_t m, int32_t n) {
  const int64_t total = int64_t{m} * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = FromF32<T>(ToF32(y[i]) + ToF32(bias[i % n]));
  }
}

// One block per row. With `delta`, x += delta is stored first (rounded to T) and the norm reads
// the stored value, as an unfused add followed by a norm would.
template <typename T>
__global__ void RmsNormKernel(T* x, const T* delta, const T* w, int32_t d, float eps, T* y) {
  const int64_t row = int64_t{blockIdx.x} * d;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float v = ToF32(x[row + j]);
    if (delta != nullptr) {
      const T stored = FromF32<T>(v + ToF32(delta[row + j]));
      x[row + j] = stored;
      v = ToF32(stored);
    }
    ss += v * v;
  }
  const float inv = rsqrtf(BlockSum(ss) / d + eps);
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    y[row + j] = FromF32<T>(ToF32(x[row + j]) * inv * ToF32(w[j]));
  }
}

// One block per token; threads over (head, pair).
template <typename T>
__global__ void RopeKernel(T* x, const int32_t* positions, int32_t num_heads, int32_t hd, bool interleaved,
                           const float* cos_sin) {
  const int32_t t = blockIdx.x, half = hd / 2;
  const float* cs = cos_sin + int64_t{positions[t]} * hd;
  for (int i = threadIdx.x; i < num_heads * half; i += blockDim.x) {
    const int h = i / half, p = i % half;
    T* v = x + (int64_t{t} * num_heads + h) * hd;
    const int a = interleaved ? 2 * p : p, b = interleaved ? 2 * p + 1 : p + half;
    const float v0 = ToF32(v[a]), v1 = ToF32(v[b]), c = cs[p], s = cs[half + p];
    v[a] = FromF32<T>(v0 * c - v1 * s);
    v[b] = FromF32<T>(v0 * s + v1 * c);
  }
}

template <typename T>
__global__ void SiluMulKernel(const T* gate, const T* up, int64_t n, T* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float g = ToF32(gate[i]);
    out[i] = FromF32<T>(g / (1.0f + __expf(-g)) * ToF32(up[i]));
  }
}

template <typename T>
__global__ void AddKernel(T* x, const T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = FromF32<T>(ToF32(x[i]) + ToF32(y[i]));
  }
}

template <typename T>
__global__ void GatherKernel(const T* table, int32_t d, const int32_t* ids, T* out) {
  const T* src = table + int64_t{ids[blockIdx.x]} * d;
  T* dst = out + int64_t{blockIdx.x} * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j];
}

// One block per token; a padding token (slot -1) writes nothing.
template <typename T>
__global__ void KvWriteKernel(T* kc, T* vc, const T* k, const T* v, const int32_t* slots, int32_t row) {
  const int64_t slot = slots[blockIdx.x];
  if (slot < 0) return;
  for (int j = threadIdx.x; j < row; j += blockDim.x) {
    kc[slot * row + j] = k[int64_t{blockIdx.x} * row + j];
    vc[slot * row + j] = v[int64_t{blockIdx.x} * row + j];
  }
}

template <typename T>
__global__ void CopyBlocksKernel(T* kc, T* vc, const int32_t* src, const int32_t* dst, int64_t block) {
  const int64_t from = src[blockIdx.x] * block, to = dst[blockIdx.x] * block;
  for (int64_t j = threadIdx.x; j < block; j += blockDim.x) {
    kc[to + j] = kc[from + j];
    vc[to + j] = vc[from + j];
  }
}

int RowThreads(int32_t d) { return d >= 2048 ? 1024 : d >= 512 ? 512 : 256; }

}  // namespace

void InvokeConvertFromF32(DType dtype, const float* src, int64_t n, void* dst, cudaStream_t s) {
  DispatchDType(dtype, [&]<typename T>() { ConvertKernel<T><<<Blocks(n), kThreads, 0, s>>>(src, n, static_cast<T*>(dst)); });
}

void InvokeAddBias(DType dtype, void* y, const void* bias, int32_t m, int32_t n, cudaStream_t s) {
  DispatchDType(dtype, [&]<typename T>() {
    AddBiasKernel<T><<<Blocks(int64_t{m} * n), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(bias), m, n);
  });
}

void InvokeRmsNorm(DType dtype, const void* x, const void* w, int32_t m, int32_t d, float eps, void* y,
                   cudaStream_t s) {
  if (m == 0) return;
  DispatchDType(dtype, [&]<typename T>() {
    RmsNormKernel<T><<<m, RowThreads(d), 0, s>>>(const_cast<T*>(static_cast<const T*>(x)), nullptr,
                                                 static_cast<const T*>(w), d, eps, static_cast<T*>(y));
  });
}

void InvokeAddRmsNorm(DType dtype, void* x, const void* delta, const void* w, int32_t m, int32_t d, float eps,
                      void* y, cudaStream_t s) {
  if (m == 0) return;
  DispatchDType(dtype, [&]<typename T>() {
    RmsNormKernel<T><<<m, RowThreads(d), 0, s>>>(static_cast<T*>(x), static_cast<const T*>(delta),
                                                 static_cast<const T*>(w), d, eps, static_cast<T*>(y));
  });
}

void InvokeRope(DType dtype, void* x, const int32_t* positions, int32_t m, int32_t num_heads, const RopeParams& p,
                cudaStream_t s) {
  if (m == 0) return;
  DispatchDType(dtype, [&]<typename T>() {
    RopeKernel<T><<<m, 128, 0, s>>>(static_cast<T*>(x), positions, num_heads, p.head_dim, p.interleaved, p.cos_sin);
  });
}

void InvokeSiluMul(DType dtype, const void* gate, const void* up, int64_t n, void* out, cudaStream_t s) {
  if (n == 0) return;
  DispatchDType(dtype, [&]<typename T>() {
    SiluMulKernel<T><<<Blocks(n), kThreads, 0, s>>>(static_cast<const T*>(gate), static_cast<const T*>(up), n,
                                                    static_cast<T*>(out));
  });
}

void InvokeAdd(DType dtype, void* x, const void* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  DispatchDType(dtype, [&]<typename T>() {
    AddKernel<T><<<Blocks(n), kThreads, 0, s>>>(static_cast<T*>(x), static_cast<const T*>(y), n);
  });
}

void InvokeEmbeddingGather(DType dtype, const void* table, int32_t d, const int32_t* ids, int32_t m, void* out,
                           cudaStream_t s) {
  if (m == 0) return;
  DispatchDType(dtype, [&]<typename T>() {
    GatherKernel<T><<<m, RowThreads(d), 0, s>>>(static_cast<const T*>(table), d, ids, static_cast<T*>(out));
  });
}

void InvokeKvWrite(DType dtype, const PagedKvLayer& kv, const void* k, const void* v, const AttentionMetadata& meta,
                   cudaStream_t s) {
  if (meta.num_tokens == 0) return;
  DispatchDType(dtype, [&]<typename T>() {
    KvWriteKernel<T><<<meta.num_tokens, 128, 0, s>>>(static_cast<T*>(kv.k), static_cast<T*>(kv.v),
                                                     static_cast<const T*>(k), static_cast<const T*>(v),
                                                     meta.slot_mapping, kv.num_kv_heads * kv.head_dim);
  });
}

void InvokeCopyKvBlocks(DType dtype, const PagedKvLayer& kv, const int32_t* src, const int32_t* dst, int32_t n,
                        cudaStream_t s) {
  if (n == 0) return;
  const int64_t block = int64_t{kv.block_size} * kv.num_kv_heads * kv.head_dim;
  DispatchDType(dtype, [&]<typename T>() {
    CopyBlocksKernel<T><<<n, 256, 0, s>>>(static_cast<T*>(kv.k), static_cast<T*>(kv.v), src, dst, block);
  });
}

}  // namespace specula::cuda

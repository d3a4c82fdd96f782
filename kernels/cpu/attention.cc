#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/simd.h"

namespace specula::cpu {
namespace {

// Softmax of row[0, n) in place. Written with the vector layer: the compiler kept the plain loops
// scalar (the max, and ExpApprox's clamp), and they were a fifth of a decode step's attention.
void Softmax(float* row, int32_t n) {
  float mx = -INFINITY, sum = 0.0f;
  int32_t tail = 0;  // the first element the scalar loops take
#ifdef SPECULA_SIMD
  using S = SimdWide;
  using V = S::V;
  tail = n / S::kLanes * S::kLanes;
  if (tail > 0) {
    V m = S::Load(row);
    for (int32_t p = S::kLanes; p < tail; p += S::kLanes) m = S::Max(m, S::Load(row + p));
    mx = S::MaxLanes(m);
  }
#endif
  for (int32_t p = tail; p < n; ++p) mx = std::max(mx, row[p]);
#ifdef SPECULA_SIMD
  if (tail > 0) {
    const V mv = S::Set1(mx);
    V acc = S::Zero();
    for (int32_t p = 0; p < tail; p += S::kLanes) {
      const V e = ExpLanes<S>(S::Sub(S::Load(row + p), mv));
      S::Store(row + p, e);
      acc = S::Add(acc, e);
    }
    sum = S::Sum(acc);
  }
#endif
  for (int32_t p = tail; p < n; ++p) {
    row[p] = ExpApprox(row[p] - mx);
    sum += row[p];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int32_t p = 0; p < n; ++p) row[p] *= inv;
}

// One layer's pool with typed elements.
template <typename T>
struct Pool {
  const T* k;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const T* v;
  int32_t num_kv_heads, block_size, head_dim;
  int64_t row() const { return static_cast<int64_t>(num_kv_heads) * head_dim; }
};

template <typename T>
Pool<T> Typed(const PagedKvLayer& kv) {
  return {static_cast<const T*>(kv.k), static_cast<const T*>(kv.v), kv.num_kv_heads, kv.block_size, kv.head_dim};
}

// The per-token kernels. Both take `heads` query heads of one token, q[heads, hd] and out[heads, hd],
// over positions [0, ctx) of the paged pool: k and v point at the first head's KV head, head h reads
// KV head h / group, `row` elements separate consecutive slots, sc[heads, ctx] is scratch.
template <typename T>
using AttendFn = void (*)(const float* q, const T* k, const T* v, const int32_t* table, int32_t bs, int64_t row,
                          int32_t ctx, int32_t heads, int32_t group, int32_t hd, float scale, float* sc, float* out);

// Any head_dim, one head at a time.
template <typename T>
void AttendPortable(const float* q, const T* k, const T* v, const int32_t* table, int32_t bs, int64_t row, int32_t ctx,
                    int32_t heads, int32_t group, int32_t hd, float scale, float* sc, float* out) {
  for (int32_t h = 0; h < heads; ++h) {
    const float* qh = q + static_cast<int64_t>(h) * hd;
    float* s = sc + static_cast<int64_t>(h) * ctx;
    float* oh = out + static_cast<int64_t>(h) * hd;
    const int64_t head_off = static_cast<int64_t>(h / group) * hd;
    for (int32_t p = 0; p < ctx; ++p) {
      const T* kp = k + head_off + (static_cast<int64_t>(table[p / bs]) * bs + p % bs) * row;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int32_t i = 0; i < hd; ++i) dot += qh[i] * ToF32(kp[i]);
      s[p] = dot * scale;
    }
    Softmax(s, ctx);
    std::fill(oh, oh + hd, 0.0f);
    for (int32_t p = 0; p < ctx; ++p) {
      const T* vp = v + head_off + (static_cast<int64_t>(table[p / bs]) * bs + p % bs) * row;
      for (int32_t i = 0; i < hd; ++i) oh[i] += s[p] * ToF32(vp[i]);
    }
  }
}

#ifdef SPECULA_SIMD
// sc[j] = scale * q . k_j for the n <= kLanes keys k_j = k + j * row: kLanes dot products reduced
// together by one lane-sum tree instead of a horizontal sum each.
template <typename S, int NV, typename T>
inline __attribute__((always_inline)) void ScoreLanes(const typename S::V (&q)[NV], const T* k, int64_t row, int32_t n,
                                                      float scale, float* sc) {
  typename S::V acc[S::kLanes];  // in registers only when this loop is unrolled
#pragma GCC unroll 16
  for (int32_t j = 0; j < S::kLanes; ++j) {
    acc[j] = S::Zero();
    if (j < n) {
      const T* kj = k + j * row;
      for (int i = 0; i < NV; ++i) acc[j] = S::Fma(q[i], S::Load(kj + S::kLanes * i), acc[j]);
    }
  }
  S::StoreFirst(sc, S::Mul(S::SumLanes(acc), S::Set1(scale)), n);
}

// Asks for the KV heads [0, kv_heads) of the first n slots of `block` (of K or V: `pool`) while the
// current block is computed: a sequence's blocks are scattered over the pool, where the hardware
// prefetcher cannot follow (measured: 1.1-2x on a bf16 decode step's attention).
template <typename T>
inline void PrefetchBlock(const T* pool, int32_t block, int32_t bs, int32_t n, int64_t row, int32_t kv_heads, int32_t hd) {
  const T* b = pool + static_cast<int64_t>(block) * bs * row;
  const int64_t bytes = static_cast<int64_t>(kv_heads) * hd * sizeof(T);
  for (int32_t j = 0; j < n; ++j) {
    const char* p = reinterpret_cast<const char*>(b + j * row);
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
  }
}

// hd = S::kLanes * NV. Block by block, every head's keys (then values) of a block before the next
// block, so that a token reads its K and V as sequential streams (one head at a time strides through
// the pool and ran at half the bandwidth in 32-sequence decode steps).
template <typename S, int NV, typename T>
void AttendSimd(const float* q, const T* k, const T* v, const int32_t* table, int32_t bs, int64_t row, int32_t ctx,
                int32_t heads, int32_t group, int32_t /*hd*/, float scale, float* sc, float* out) {
  using V = typename S::V;
  constexpr int32_t L = S::kLanes, hd = L * NV;
  for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
    const T* kb = k + static_cast<int64_t>(table[p0 / bs]) * bs * row;
    const int32_t n = std::min(bs, ctx - p0);
    if (p0 + bs < ctx) PrefetchBlock(k, table[p0 / bs + 1], bs, std::min(bs, ctx - p0 - bs), row, heads / group, hd);
    for (int32_t h = 0; h < heads; ++h) {
      V qh[NV];
      for (int i = 0; i < NV; ++i) qh[i] = S::Load(q + h * hd + L * i);
      const T* kh = kb + (h / group) * hd;
      float* s = sc + static_cast<int64_t>(h) * ctx + p0;
      for (int32_t j = 0; j < n; j += L) ScoreLanes<S, NV>(qh, kh + j * row, row, std::min(L, n - j), scale, s + j);
    }
  }
  for (int32_t h = 0; h < heads; ++h) Softmax(sc + static_cast<int64_t>(h) * ctx, ctx);
  std::fill(out, out + heads * hd, 0.0f);
  for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
    const T* vb = v + static_cast<int64_t>(table[p0 / bs]) * bs * row;
    const int32_t n = std::min(bs, ctx - p0);
    if (p0 + bs < ctx) PrefetchBlock(v, table[p0 / bs + 1], bs, std::min(bs, ctx - p0 - bs), row, heads / group, hd);
    for (int32_t h = 0; h < heads; ++h) {
      V acc[NV];
      for (int i = 0; i < NV; ++i) acc[i] = S::Load(out + h * hd + L * i);
      const T* vh = vb + (h / group) * hd;
      const float* w = sc + static_cast<int64_t>(h) * ctx + p0;
      for (int32_t j = 0; j < n; ++j) {
        const V wj = S::Set1(w[j]);
        for (int i = 0; i < NV; ++i) acc[i] = S::Fma(S::Load(vh + j * row + L * i), wj, acc[i]);
      }
      for (int i = 0; i < NV; ++i) S::Store(out + h * hd + L * i, acc[i]);
    }
  }
}
#endif

// The SIMD kernel at the widest vector the head fills, the portable one for other head sizes.
template <typename T>
AttendFn<T> PickAttend(int32_t hd) {
#if defined(__AVX512F__)
  switch (hd) {
    case 16: return AttendSimd<Simd16, 1, T>;
    case 32: return AttendSimd<Simd16, 2, T>;
    case 48: return AttendSimd<Simd16, 3, T>;
    case 64: return AttendSimd<Simd16, 4, T>;
    case 80: return AttendSimd<Simd16, 5, T>;
    case 96: return AttendSimd<Simd16, 6, T>;
    case 128: return AttendSimd<Simd16, 8, T>;
    default: break;
  }
#endif
#ifdef SPECULA_AVX2
  switch (hd) {
    case 8: return AttendSimd<Simd8, 1, T>;
    case 16: return AttendSimd<Simd8, 2, T>;
    case 24: return AttendSimd<Simd8, 3, T>;
    case 32: return AttendSimd<Simd8, 4, T>;
    case 40: return AttendSimd<Simd8, 5, T>;
    case 48: return AttendSimd<Simd8, 6, T>;
    case 56: return AttendSimd<Simd8, 7, T>;
    case 64: return AttendSimd<Simd8, 8, T>;
    case 80: return AttendSimd<Simd8, 10, T>;
    case 96: return AttendSimd<Simd8, 12, T>;
    case 128: return AttendSimd<Simd8, 16, T>;
    default: break;
  }
#endif
  return AttendPortable<T>;
}

}  // namespace

bool CpuKvDtype(DType d) { return d == DType::kF32 || d == DType::kBF16; }

void WriteKv(const PagedKvLayer& kv, const float* k, const float* v, const AttentionMetadata& meta) {
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  for (int32_t t = 0; t < meta.num_tokens; ++t) {
    const int64_t slot = meta.slot_mapping[t];
    if (slot < 0) continue;  // padding
    const float *ks = k + t * row, *vs = v + t * row;
    if (kv.dtype == DType::kBF16) {
      Bf16* kd = static_cast<Bf16*>(kv.k) + slot * row;
      Bf16* vd = static_cast<Bf16*>(kv.v) + slot * row;
      for (int64_t i = 0; i < row; ++i) kd[i] = ToBf16(ks[i]);
      for (int64_t i = 0; i < row; ++i) vd[i] = ToBf16(vs[i]);
    } else {
      std::memcpy(static_cast<float*>(kv.k) + slot * row, ks, sizeof(float) * row);
      std::memcpy(static_cast<float*>(kv.v) + slot * row, vs, sizeof(float) * row);
    }
  }
}

void CopyKvBlocks(const PagedKvLayer& kv, const int32_t* src, const int32_t* dst, int32_t n) {
  const int64_t block = static_cast<int64_t>(kv.block_size) * kv.num_kv_heads * kv.head_dim * DTypeBytes(kv.dtype);
  char *k = static_cast<char*>(kv.k), *v = static_cast<char*>(kv.v);
  for (int32_t i = 0; i < n; ++i) {
    std::memcpy(k + dst[i] * block, k + src[i] * block, block);
    std::memcpy(v + dst[i] * block, v + src[i] * block, block);
  }
}

void PagedAttention::Run(const float* q, const PagedKvLayer& kv, const AttentionMetadata& meta, int32_t num_heads,
                         float scale, float* out) {
  if (kv.dtype == DType::kBF16) return RunTyped<Bf16>(q, kv, meta, num_heads, scale, out);
  RunTyped<float>(q, kv, meta, num_heads, scale, out);
}

template <typename T>
void PagedAttention::RunTyped(const float* q, const PagedKvLayer& layer, const AttentionMetadata& meta,
                              int32_t num_heads, float scale, float* out) {
  const Pool<T> kv = Typed<T>(layer);
  tokens_.clear();
  int64_t work = 0;  // positions attended
  for (int32_t s = 0; s < meta.num_seqs; ++s) {
    for (int32_t t = meta.query_start[s]; t < meta.query_start[s + 1]; ++t) {
      tokens_.push_back({t, s});
      work += meta.positions[t] + 1;
    }
  }
  if (tokens_.empty()) return;
  const int32_t hd = kv.head_dim, group = num_heads / kv.num_kv_heads, tokens = static_cast<int32_t>(tokens_.size());
  const int64_t row = kv.row();
  const AttendFn<T> attend = PickAttend<T>(hd);
  auto table_of = [&](int32_t s) { return meta.block_tables + static_cast<int64_t>(s) * meta.max_blocks_per_seq; };
  if (tokens >= 4 * omp_get_max_threads()) {
    // Enough tokens to keep the cores busy one token each: all heads of a token together. A prefill
    // chunk's tokens read the same K/V, which stays in cache from one token to the next.
#pragma omp parallel for schedule(dynamic, 1)
    for (int32_t i = 0; i < tokens; ++i) {
      const auto [t, s] = tokens_[i];
      const int32_t ctx = meta.positions[t] + 1;
      thread_local std::vector<float> sc;  // [num_heads, ctx]
      sc.resize(static_cast<size_t>(num_heads) * ctx);
      const int64_t off = static_cast<int64_t>(t) * num_heads * hd;
      attend(q + off, kv.k, kv.v, table_of(s), kv.block_size, row, ctx, num_heads, group, hd, scale, sc.data(), out + off);
    }
    return;
  }
  // Few tokens (single-sequence decode): one (token, head) pair per item.
  const int32_t items = tokens * num_heads;
#pragma omp parallel for schedule(static, 1) if (work * hd * num_heads >= (1 << 11))
  for (int32_t item = 0; item < items; ++item) {
    const auto [t, s] = tokens_[item / num_heads];
    const int32_t h = item % num_heads, ctx = meta.positions[t] + 1;
    thread_local std::vector<float> sc;  // [ctx]
    sc.resize(ctx);
    const int64_t off = (static_cast<int64_t>(t) * num_heads + h) * hd, head_off = static_cast<int64_t>(h / group) * hd;
    attend(q + off, kv.k + head_off, kv.v + head_off, table_of(s), kv.block_size, row, ctx, 1, 1, hd, scale, sc.data(),
           out + off);
  }
}

}  // namespace specula::cpu

#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/parallel_rows.h"
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
  const T* k;  // [num_blocks, num_kv_heads, block_size, head_dim]
  const T* v;
  int32_t num_kv_heads, block_size, head_dim;
  int64_t block() const { return static_cast<int64_t>(num_kv_heads) * block_size * head_dim; }  // elements
};

template <typename T>
Pool<T> Typed(const PagedKvLayer& kv) {
  return {static_cast<const T*>(kv.k), static_cast<const T*>(kv.v), kv.num_kv_heads, kv.block_size, kv.head_dim};
}

// The kernels. Both take nq tokens of one sequence with `heads` query heads each, q[nq, heads, hd] and
// out[nq, heads, hd], token i over positions [0, ctx[i]) of the paged pool: k and v point at the
// first head's KV head in block 0, head h reads KV head h / group (bs * hd elements further on per KV
// head), `block` elements separate consecutive blocks, sc[nq, heads, max ctx] is scratch. Each
// token's result is the same bits whatever nq is.
template <typename T>
using AttendFn = void (*)(const float* q, const T* k, const T* v, const int32_t* table, int32_t bs, int64_t block,
                          const int32_t* ctx, int32_t nq, int32_t heads, int32_t group, int32_t hd, float scale,
                          float* sc, float* out);

// Any head_dim, one token and head at a time.
template <typename T>
void AttendPortable(const float* q, const T* k, const T* v, const int32_t* table, int32_t bs, int64_t block,
                    const int32_t* ctxs, int32_t nq, int32_t heads, int32_t group, int32_t hd, float scale, float* sc,
                    float* out) {
  const int32_t cmax = *std::max_element(ctxs, ctxs + nq);
  for (int32_t qi = 0; qi < nq; ++qi) {
    const int32_t ctx = ctxs[qi];
    for (int32_t h = 0; h < heads; ++h) {
      const float* qh = q + (static_cast<int64_t>(qi) * heads + h) * hd;
      float* s = sc + (static_cast<int64_t>(qi) * heads + h) * cmax;
      float* oh = out + (static_cast<int64_t>(qi) * heads + h) * hd;
      const int64_t head_off = static_cast<int64_t>(h / group) * bs * hd;
      auto at = [&](int32_t p) { return head_off + table[p / bs] * block + static_cast<int64_t>(p % bs) * hd; };
      for (int32_t p = 0; p < ctx; ++p) {
        const T* kp = k + at(p);
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int32_t i = 0; i < hd; ++i) dot += qh[i] * ToF32(kp[i]);
        s[p] = dot * scale;
      }
      Softmax(s, ctx);
      std::fill(oh, oh + hd, 0.0f);
      for (int32_t p = 0; p < ctx; ++p) {
        const T* vp = v + at(p);
        for (int32_t i = 0; i < hd; ++i) oh[i] += s[p] * ToF32(vp[i]);
      }
    }
  }
}

#ifdef SPECULA_SIMD
// A head's hd = NV * kLanes elements of K or V as vectors. bf16 goes in pairs of vectors (LoadSplit):
// vector 2p holds the even-indexed elements of [2p * kLanes, (2p + 2) * kLanes) and vector 2p + 1
// the odd-indexed ones, and an unpaired last vector is in order. Widening bf16 in order took a
// shuffle and a shift per vector, on the two ports the FMAs need as well; the queries and the
// outputs take the same order (Deinterleave, Interleave), and each output element is the same
// chain of FMAs.
template <typename T>
constexpr bool kSplitKv = std::is_same_v<T, Bf16>;

template <typename S, int NV, typename T>
inline __attribute__((always_inline)) void LoadKv(const T* p, typename S::V (&v)[NV]) {
  if constexpr (kSplitKv<T>) {
#pragma GCC unroll 16
    for (int u = 0; u + 1 < NV; u += 2) S::LoadSplit(p + S::kLanes * u, v[u], v[u + 1]);
    if constexpr (NV % 2 == 1) v[NV - 1] = S::Load(p + S::kLanes * (NV - 1));
  } else {
#pragma GCC unroll 16
    for (int u = 0; u < NV; ++u) v[u] = S::Load(p + S::kLanes * u);
  }
}

// sc[j] = scale * q . k_j for the n <= kLanes keys k_j = k + j * stride: kLanes dot products reduced
// together by one lane-sum tree instead of a horizontal sum each.
template <typename S, int NV, typename T>
inline __attribute__((always_inline)) void ScoreLanes(const typename S::V (&q)[NV], const T* k, int64_t stride, int32_t n,
                                                      float scale, float* sc) {
  typename S::V acc[S::kLanes];  // in registers only when this loop is unrolled
#pragma GCC unroll 16
  for (int32_t j = 0; j < S::kLanes; ++j) {
    acc[j] = S::Zero();
    if (j < n) {
      typename S::V kv[NV];
      LoadKv<S, NV>(k + j * stride, kv);
      for (int i = 0; i < NV; ++i) acc[j] = S::Fma(q[i], kv[i], acc[j]);
    }
  }
  S::StoreFirst(sc, S::Mul(S::SumLanes(acc), S::Set1(scale)), n);
}

// ScoreLanes for two tokens' queries on the same n keys: each key vector is loaded (and widened from
// bf16) once for both. Each score is the same chain of FMAs and the same lane sum as ScoreLanes'.
template <typename S, int NV, typename T>
inline __attribute__((always_inline)) void ScorePair(const typename S::V (&q0)[NV], const typename S::V (&q1)[NV],
                                                     const T* k, int64_t stride, int32_t n, float scale, float* s0,
                                                     float* s1) {
  typename S::V a0[S::kLanes], a1[S::kLanes];
#pragma GCC unroll 16
  for (int32_t j = 0; j < S::kLanes; ++j) {
    a0[j] = a1[j] = S::Zero();
    if (j < n) {
      typename S::V kv[NV];
      LoadKv<S, NV>(k + j * stride, kv);
      for (int i = 0; i < NV; ++i) {
        a0[j] = S::Fma(q0[i], kv[i], a0[j]);
        a1[j] = S::Fma(q1[i], kv[i], a1[j]);
      }
    }
  }
  S::StoreFirst(s0, S::Mul(S::SumLanes(a0), S::Set1(scale)), n);
  S::StoreFirst(s1, S::Mul(S::SumLanes(a1), S::Set1(scale)), n);
}

#if defined(__AVX512F__)
// ScorePair at 16 lanes, where two tokens' 16 accumulators each do not fit the registers: two tokens
// on n <= 8 keys, the 16 accumulators [token 0's keys, token 1's keys] reduced by one SumLanes. Each
// score is the same chain of FMAs as ScoreLanes', and SumLanes sums every vector's lanes by the same
// tree whichever slot it has, so each score is the same bits.
template <int NV, typename T>
inline __attribute__((always_inline)) void ScoreHalves(const __m512 (&q0)[NV], const __m512 (&q1)[NV], const T* k,
                                                       int64_t stride, int32_t n, float scale, float* s0, float* s1) {
  using S = Simd16;
  __m512 a[16];
#pragma GCC unroll 16
  for (int32_t j = 0; j < 8; ++j) {
    a[j] = a[8 + j] = S::Zero();
    if (j < n) {
      __m512 kv[NV];
      LoadKv<S, NV>(k + j * stride, kv);
      for (int i = 0; i < NV; ++i) {
        a[j] = S::Fma(q0[i], kv[i], a[j]);
        a[8 + j] = S::Fma(q1[i], kv[i], a[8 + j]);
      }
    }
  }
  const __m512 r = S::Mul(S::SumLanes(a), S::Set1(scale));
  S::StoreFirst(s0, r, n);
  // Lanes 8..15 down to 0..7 (a shufflevector: GCC 12's shuffle intrinsic trips -Wmaybe-uninitialized).
  S::StoreFirst(s1, __builtin_shufflevector(r, r, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15), n);
}
#endif

// A KV prefetch's hint, by vendor. AMD (Zen 3): non-temporal, so that a batched decode step's reads
// of each sequence's KV once (78 MB at 32 x ~350 positions) do not push the layers' weights out of
// the last-level cache (a 32-sequence batching run: 2-3% faster in each of two alternated pairs).
// Intel (a Xeon with AVX-512, 2026-11-25): into L2. There PREFETCHNTA stalled the loads it ran
// beside (77% of the kernel's samples; a 32 x 400 bf16 decode step ran 3.6x slower than with T0),
// and T1 read KV from DRAM 13% faster than T0 (attention_bench at 32 x 1600) and took 10% off the
// decode steps' attention in a 32-sequence batching run.
inline const bool kKvPrefetchNta = __builtin_cpu_is("amd");

inline __attribute__((always_inline)) void PrefetchKvLine(const char* p) {
  if (kKvPrefetchNta) {
    _mm_prefetch(p, _MM_HINT_NTA);
  } else {
    _mm_prefetch(p, _MM_HINT_T1);
  }
}

// Part `part` of `parts` of the first n slots of one KV head of a block (`p` points at the head's
// [bs, hd] elements there), one contiguous range, asked for while the current block is computed: a
// sequence's blocks are scattered over the pool, where the hardware prefetcher cannot follow
// (measured: 1.1-2x on a bf16 decode step's attention). Each query head asks for its part of its KV
// head: the whole block (144 lines in bf16 at the stories15m shape) asked for at once filled the
// core's miss buffers, and the prefetches then stalled the loads of the block being computed
// (decode 32 x 400 bf16: 1.55x faster spread). Inlined wherever it is called: GCC finds a function
// of prefetches alone free of side effects and deletes the calls.
template <typename T>
inline __attribute__((always_inline)) void PrefetchHead(const T* p, int32_t n, int32_t hd, int32_t part, int32_t parts) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / 64;
  const int64_t lines = static_cast<int64_t>((reinterpret_cast<uintptr_t>(p + static_cast<int64_t>(n) * hd) + 63) / 64 - first);
  const char* b = reinterpret_cast<const char*>(first * 64);
  for (int64_t l = lines * part / parts; l < lines * (part + 1) / parts; ++l) PrefetchKvLine(b + 64 * l);
}

// Tokens t < G over the values [0, n) of one KV head of a block (vh: [n, hd]), weights w[t][0, n),
// outputs o[t][hd] (+=): each value vector is loaded and widened once for all G tokens, and each output
// element is the same chain of FMAs over j as for its token alone. G * NV accumulators stay in
// registers (the loops are unrolled by pragma, as in the GEMM tiles).
template <typename S, int NV, int G, typename T>
inline __attribute__((always_inline)) void ValueTokens(const T* vh, int32_t n, const float* const* w, float* const* o) {
  using V = typename S::V;
  constexpr int32_t L = S::kLanes, hd = L * NV;
  V acc[G][NV];
#pragma GCC unroll 16
  for (int t = 0; t < G; ++t) {
#pragma GCC unroll 16
    for (int u = 0; u < NV; ++u) acc[t][u] = S::Load(o[t] + L * u);
  }
  for (int32_t j = 0; j < n; ++j) {
    V vv[NV];
    LoadKv<S, NV>(vh + j * hd, vv);
#pragma GCC unroll 16
    for (int t = 0; t < G; ++t) {
      const V x = S::Set1(w[t][j]);
#pragma GCC unroll 16
      for (int u = 0; u < NV; ++u) acc[t][u] = S::Fma(vv[u], x, acc[t][u]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < G; ++t) {
#pragma GCC unroll 16
    for (int u = 0; u < NV; ++u) S::Store(o[t] + L * u, acc[t][u]);
  }
}

// The queries q[nq, heads, hd] in LoadKv's order (hd = S::kLanes * NV), once: a query head is
// loaded for every block.
template <typename S, int NV>
inline __attribute__((always_inline)) const float* SplitQueries(const float* q, int32_t nq, int32_t heads) {
  using V = typename S::V;
  constexpr int32_t L = S::kLanes, hd = L * NV;
  thread_local std::vector<float> split;  // [nq, heads, hd]
  split.resize(static_cast<size_t>(nq) * heads * hd);
  for (int64_t r = 0; r < static_cast<int64_t>(nq) * heads; ++r) {
    float* d = split.data() + r * hd;
    const float* s = q + r * hd;
    for (int u = 0; u + 1 < NV; u += 2) {
      V even, odd;
      S::Deinterleave(s + L * u, even, odd);
      S::Store(d + L * u, even);
      S::Store(d + L * (u + 1), odd);
    }
    if constexpr (NV % 2 == 1) S::Store(d + L * (NV - 1), S::Load(s + L * (NV - 1)));
  }
  return split.data();
}

// The outputs out[nq, heads, hd] back from LoadKv's order, in place.
template <typename S, int NV>
inline __attribute__((always_inline)) void InterleaveOutputs(float* out, int32_t nq, int32_t heads) {
  constexpr int32_t L = S::kLanes, hd = L * NV;
  for (int64_t r = 0; r < static_cast<int64_t>(nq) * heads; ++r) {
    float* o = out + r * hd;
    for (int u = 0; u + 1 < NV; u += 2) S::Interleave(S::Load(o + L * u), S::Load(o + L * (u + 1)), o + L * u);
  }
}

// One call of AttendSimd: its arguments (AttendFn's, with the queries in LoadKv's order) and its
// passes' work on one query head of one block, always inlined, so that AttendSimd compiles to the
// loops it has with them written in place.
template <typename S, int NV, typename T>
struct SimdAttention {
  using V = typename S::V;
  static constexpr int32_t L = S::kLanes, hd = L * NV;
  // Scores of tokens in pairs on AVX2 (a prefill chunk's or a verification's): the 16 registers hold
  // two tokens' accumulators of 8 lanes.
  static constexpr bool kPairs = L == 8 && NV <= 6;
  // At 16 lanes, scores of tokens in pairs on 8 keys at a time (ScoreHalves), up to five vectors a
  // head (the registers' limit). attention_bench's 512-token prefill chunk, alternated 3 times with
  // one token at a time: bf16 6.1-6.2 ms against 6.8-7.1, f32 6.1-6.3 against 6.2-6.4.
  static constexpr bool kHalves = L == 16 && NV <= 5;
  // Tokens that share each value vector loaded (ValueTokens): as many as leave registers for one
  // head's values and a weight (32 registers at 16 lanes, 16 at 8), at most 8 (an item's tokens);
  // AVX2 keeps its pairs at six vectors a head. attention_bench's 512-token prefill chunk on
  // AVX-512, alternated with one token at a time: bf16 6.9-7.1 ms against 8.5-9.2, f32 6.2-6.6
  // against 6.7-7.1.
  static constexpr int32_t kValueGroup =
      std::max<int32_t>(kPairs ? 2 : 1, std::min<int32_t>(8, ((L == 16 ? 32 : 16) - 1 - NV) / NV));

  const float* q;        // [nq, heads, hd]
  const int32_t* table;  // [ceil(cmax / bs)]: the sequence's blocks
  int32_t bs;
  int64_t block;         // elements between consecutive blocks
  const int32_t* ctx;    // [nq]
  int32_t nq, heads, group;
  float scale;
  float* sc;             // [nq, heads, cmax]
  int32_t cmax;
  int64_t head_stride;   // between KV heads in a block: bs * hd

  __attribute__((always_inline)) void LoadQ(int32_t i, int32_t h, V (&qh)[NV]) const {
    const float* qt = q + (static_cast<int64_t>(i) * heads + h) * hd;
    for (int u = 0; u < NV; ++u) qh[u] = S::Load(qt + L * u);
  }

  __attribute__((always_inline)) float* ScoreRow(int32_t i, int32_t h, int32_t p0) const {
    return sc + (static_cast<int64_t>(i) * heads + h) * cmax + p0;
  }

  // Asks for head h's part of its KV head in the next block of `pool` (see PrefetchHead).
  __attribute__((always_inline)) void Prefetch(const T* pool, int32_t p0, int32_t h) const {
    if (p0 + bs >= cmax) return;
    const int32_t next = table[p0 / bs + 1], n = std::min(bs, cmax - p0 - bs);
    PrefetchHead(pool + next * block + (h / group) * head_stride, n, hd, h % group, group);
  }

  // Every token over the block at p0: with kPairs or kHalves, pair(i, both) takes tokens i and i + 1
  // on the keys [0, both) they both reach; then one(i, from, n) takes each token's keys [from, n) alone.
  template <typename Pair, typename One>
  __attribute__((always_inline)) void ByPairs(int32_t p0, Pair&& pair, One&& one) const {
    int32_t i = 0;
    if constexpr (kPairs || kHalves) {
      for (; i + 1 < nq; i += 2) {
        const int32_t n0 = std::min(bs, ctx[i] - p0), n1 = std::min(bs, ctx[i + 1] - p0);
        const int32_t both = std::max(0, std::min(n0, n1));
        if (both > 0) pair(i, both);
        one(i, both, n0);
        one(i + 1, both, n1);
      }
    }
    for (; i < nq; ++i) one(i, 0, std::min(bs, ctx[i] - p0));
  }

  // Every token's scores of query head h on the keys kh[bs, hd] of the block at p0.
  __attribute__((always_inline)) void ScoreHead(const T* kh, int32_t p0, int32_t h) const {
    // Token i's keys [from, n) of the block, on their own.
    auto one = [&](int32_t i, int32_t from, int32_t n) __attribute__((always_inline)) {
      if (from >= n) return;
      V qh[NV];
      LoadQ(i, h, qh);
      float* s = ScoreRow(i, h, p0);
      for (int32_t j = from; j < n; j += L) ScoreLanes<S, NV>(qh, kh + j * hd, hd, std::min(L, n - j), scale, s + j);
    };
    auto pair = [&](int32_t i, int32_t both) __attribute__((always_inline)) {
      V q0[NV], q1[NV];
      LoadQ(i, h, q0);
      LoadQ(i + 1, h, q1);
      float *s0 = ScoreRow(i, h, p0), *s1 = ScoreRow(i + 1, h, p0);
      if constexpr (kHalves) {
#if defined(__AVX512F__)
        for (int32_t j = 0; j < both; j += 8) {
          ScoreHalves<NV>(q0, q1, kh + j * hd, hd, std::min(8, both - j), scale, s0 + j, s1 + j);
        }
#endif
      } else {
        for (int32_t j = 0; j < both; j += L) {
          ScorePair<S, NV>(q0, q1, kh + j * hd, hd, std::min(L, both - j), scale, s0 + j, s1 + j);
        }
      }
    };
    ByPairs(p0, pair, one);
  }

  // Every token's outputs out[nq, heads, hd] of query head h (+=), weighted by its scores (softmaxed),
  // over the values vh[bs, hd] of the block at p0. Up to kValueGroup tokens share each value vector
  // on the values they all reach, then each token takes the rest of its own alone.
  __attribute__((always_inline)) void ValueHead(const T* vh, int32_t p0, int32_t h, float* out) const {
    for (int32_t i = 0; i < nq; i += kValueGroup) {
      const int32_t g = std::min(kValueGroup, nq - i);
      int32_t n[kValueGroup], common = bs;
      const float* w[kValueGroup];
      float* o[kValueGroup];
      for (int32_t t = 0; t < g; ++t) {
        n[t] = std::min(bs, ctx[i + t] - p0);
        common = std::min(common, std::max(0, n[t]));
        w[t] = ScoreRow(i + t, h, p0);
        o[t] = out + (static_cast<int64_t>(i + t) * heads + h) * hd;
      }
      if (common > 0) {
        [&]<int... G>(std::integer_sequence<int, G...>) {
          ((g == G + 1 ? ValueTokens<S, NV, G + 1>(vh, common, w, o) : void()), ...);
        }(std::make_integer_sequence<int, kValueGroup>());
      }
      // The rest of each token's values alone: the same chains, continued.
      for (int32_t t = 0; t < g; ++t) {
        if (n[t] <= common) continue;
        const float* wt = w[t] + common;
        ValueTokens<S, NV, 1>(vh + static_cast<int64_t>(common) * hd, n[t] - common, &wt, &o[t]);
      }
    }
  }
};

// hd = S::kLanes * NV. Block by block, every head's keys (then values) of a block before the next
// block, so that a token reads its K and V as sequential streams (one head at a time strides through
// the pool and ran at half the bandwidth in 32-sequence decode steps); within a block, each KV head's
// slots are contiguous (a head's keys strode 576 bytes apart at the stories15m shape when a block held
// whole slots: a 32-sequence batching run took 3% longer). The nq tokens (a prefill chunk's
// or a verification's) take turns on each head's rows of a block while they are in L1: a 512-token
// prefill chunk ran 1.3x (bf16) to 1.9x (f32) faster than one token at a time. Each token's sums run in
// the same order whatever nq is. (Widening a bf16 block to f32 once for all nq tokens: at most 1.04-1.2x
// on that chunk, about 0.5% of a batched run; not kept.)
template <typename S, int NV, typename T>
void AttendSimd(const float* q, const T* k, const T* v, const int32_t* table, int32_t bs, int64_t block,
                const int32_t* ctx, int32_t nq, int32_t heads, int32_t group, int32_t /*hd*/, float scale, float* sc,
                float* out) {
  using A = SimdAttention<S, NV, T>;
  constexpr int32_t hd = A::hd;
  const int32_t cmax = *std::max_element(ctx, ctx + nq);
  if constexpr (kSplitKv<T>) q = SplitQueries<S, NV>(q, nq, heads);
  const A a{q, table, bs, block, ctx, nq, heads, group, scale, sc, cmax, static_cast<int64_t>(bs) * hd};
  for (int32_t p0 = 0; p0 < cmax; p0 += bs) {
    const T* kb = k + table[p0 / bs] * block;
    for (int32_t h = 0; h < heads; ++h) {
      a.Prefetch(k, p0, h);
      a.ScoreHead(kb + (h / group) * a.head_stride, p0, h);
    }
  }
  for (int32_t i = 0; i < nq; ++i) {
    for (int32_t h = 0; h < heads; ++h) Softmax(sc + (static_cast<int64_t>(i) * heads + h) * cmax, ctx[i]);
  }
  std::fill(out, out + static_cast<int64_t>(nq) * heads * hd, 0.0f);
  for (int32_t p0 = 0; p0 < cmax; p0 += bs) {
    const T* vb = v + table[p0 / bs] * block;
    for (int32_t h = 0; h < heads; ++h) {
      a.Prefetch(v, p0, h);
      a.ValueHead(vb + (h / group) * a.head_stride, p0, h, out);
    }
  }
  if constexpr (kSplitKv<T>) InterleaveOutputs<S, NV>(out, nq, heads);
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
  const int32_t hd = kv.head_dim, bs = kv.block_size;
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * hd;
  ParallelFor(meta.num_tokens, 2 * row, [&](int64_t t) {
    const int64_t slot = meta.slot_mapping[t];
    if (slot < 0) return;  // padding
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const float *ks = k + t * row + h * hd, *vs = v + t * row + h * hd;
      const int64_t at = KvOffset(kv, slot / bs, h, static_cast<int32_t>(slot % bs));
      if (kv.dtype == DType::kBF16) {
        Bf16 *kd = static_cast<Bf16*>(kv.k) + at, *vd = static_cast<Bf16*>(kv.v) + at;
        for (int32_t i = 0; i < hd; ++i) kd[i] = ToBf16(ks[i]);
        for (int32_t i = 0; i < hd; ++i) vd[i] = ToBf16(vs[i]);
      } else {
        std::memcpy(static_cast<float*>(kv.k) + at, ks, sizeof(float) * hd);
        std::memcpy(static_cast<float*>(kv.v) + at, vs, sizeof(float) * hd);
      }
    }
  });
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
  const int32_t tokens = meta.query_start[meta.num_seqs] - meta.query_start[0];
  if (tokens <= 0) return;
  int64_t work = 0;  // positions attended
  for (int32_t s = 0; s < meta.num_seqs; ++s) {
    for (int32_t t = meta.query_start[s]; t < meta.query_start[s + 1]; ++t) work += meta.positions[t] + 1;
  }
  const int32_t hd = kv.head_dim, group = num_heads / kv.num_kv_heads, threads = omp_get_max_threads();
  const int64_t block = kv.block();
  const AttendFn<T> attend = PickAttend<T>(hd);
  constexpr int32_t kMaxGroup = 8;  // tokens of a sequence in one item
  auto table_of = [&](int32_t s) { return meta.block_tables + static_cast<int64_t>(s) * meta.max_blocks_per_seq; };
  // Items of up to `per` consecutive tokens of one sequence; count(per) is how many there are.
  auto count = [&](int32_t per) {
    int32_t n = 0;
    for (int32_t s = 0; s < meta.num_seqs; ++s) n += (meta.query_start[s + 1] - meta.query_start[s] + per - 1) / per;
    return n;
  };
  auto split = [&](int32_t per) {
    items_.clear();
    for (int32_t s = 0; s < meta.num_seqs; ++s) {
      for (int32_t t = meta.query_start[s]; t < meta.query_start[s + 1]; t += per) {
        items_.push_back({t, std::min(per, meta.query_start[s + 1] - t), s});
      }
    }
  };
  if (tokens >= 4 * threads) {
    // Enough tokens to keep the cores busy: all heads of a token together, and up to kMaxGroup tokens
    // of a sequence (a prefill chunk's, a verification's) together while at least 4 items per thread
    // remain: they share every block of K and V read.
    int32_t per = kMaxGroup;
    while (per > 1 && count(per) < 4 * threads) per /= 2;
    split(per);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < items_.size(); ++i) {
      const auto [t, nq, s] = items_[i];
      int32_t ctx[kMaxGroup], cmax = 0;
      for (int32_t j = 0; j < nq; ++j) cmax = std::max(cmax, ctx[j] = meta.positions[t + j] + 1);
      thread_local std::vector<float> sc;  // [nq, num_heads, cmax]
      sc.resize(static_cast<size_t>(nq) * num_heads * cmax);
      const int64_t off = static_cast<int64_t>(t) * num_heads * hd;
      attend(q + off, kv.k, kv.v, table_of(s), kv.block_size, block, ctx, nq, num_heads, group, hd, scale, sc.data(),
             out + off);
    }
    return;
  }
  // Few tokens (a small decode batch, a verification): one query head of up to kMaxGroup tokens of a
  // sequence per item, so that a verification's tokens share each K and V vector read on the head.
  split(kMaxGroup);
  const int32_t items = static_cast<int32_t>(items_.size()) * num_heads;
#pragma omp parallel for schedule(static, 1) if (work * hd * num_heads >= (1 << 11))
  for (int32_t item = 0; item < items; ++item) {
    const auto [t, nq, s] = items_[item / num_heads];
    const int32_t h = item % num_heads;
    int32_t ctx[kMaxGroup], cmax = 0;
    for (int32_t j = 0; j < nq; ++j) cmax = std::max(cmax, ctx[j] = meta.positions[t + j] + 1);
    // The scores [nq, cmax]; with several tokens, their queries and outputs [nq, hd] each, gathered
    // (a token's rows are num_heads * hd apart).
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(nq) * (cmax + (nq > 1 ? 2 * hd : 0)));
    const int64_t row = static_cast<int64_t>(num_heads) * hd, off = t * row + static_cast<int64_t>(h) * hd;
    float* sc = buf.data();
    const float* qi = q + off;
    float* oi = out + off;
    if (nq > 1) {
      float* gathered = sc + static_cast<int64_t>(nq) * cmax;
      for (int32_t j = 0; j < nq; ++j) std::memcpy(gathered + j * hd, q + off + j * row, sizeof(float) * hd);
      qi = gathered;
      oi = gathered + static_cast<int64_t>(nq) * hd;
    }
    const int64_t head_off = KvOffset(layer, 0, h / group, 0);  // within a block
    attend(qi, kv.k + head_off, kv.v + head_off, table_of(s), kv.block_size, block, ctx, nq, 1, 1, hd, scale, sc, oi);
    for (int32_t j = 0; nq > 1 && j < nq; ++j) std::memcpy(out + off + j * row, oi + j * hd, sizeof(float) * hd);
  }
}

}  // namespace specula::cpu

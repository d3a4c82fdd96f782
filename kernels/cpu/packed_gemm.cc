#include "kernels/cpu/packed_gemm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include <omp.h>

#include "kernels/cpu/simd.h"

namespace specula::cpu {

PackedArena::~PackedArena() {
  for (auto& [base, bytes] : chunks_) std::free(base);
}

void* AllocHugePages(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t size = (std::max<size_t>(bytes, 1) + kHuge - 1) / kHuge * kHuge;
  void* base = std::aligned_alloc(kHuge, size);
  if (base != nullptr) ::madvise(base, size, MADV_HUGEPAGE);
  return base;
}

float* PackedArena::Alloc(size_t floats) {
  constexpr size_t kHuge = size_t{2} << 20, kChunk = size_t{32} << 20;
  const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
  if (chunks_.empty() || used_ + bytes > chunks_.back().second) {
    // Untouched parts of a chunk cost no memory: pages are only faulted in when packing writes them.
    const size_t size = (std::max(bytes, kChunk) + kHuge - 1) / kHuge * kHuge;
    char* base = static_cast<char*>(AllocHugePages(size));
    if (base == nullptr) std::abort();
    chunks_.push_back({base, size});
    used_ = 0;
  }
  float* p = reinterpret_cast<float*>(chunks_.back().first + used_);
  used_ += bytes;
  return p;
}

PackedMatrix::PackedMatrix(const float* w, int64_t rows, int64_t cols, PackedArena* arena) : rows_(rows), cols_(cols) {
  const int64_t groups = (rows + kGroup - 1) / kGroup;
  float* d = arena->Alloc(static_cast<size_t>(groups * cols * kGroup));
  data_ = d;
  // A group's transpose in tiles of kCols columns: the tile's output (kCols x 64 floats, 4 KB) and
  // the 64 rows' pieces it reads stay in L1. Row by row over whole columns, each row's stores
  // strode through the group's whole output (74 KB at 288 columns), and packing took 40% of the
  // samples of `specula generate --max-tokens 1` on a stories15m-shape file.
  constexpr int64_t kCols = 16;
#pragma omp parallel for schedule(static) if (groups * cols * kGroup >= (1 << 16))
  for (int64_t g = 0; g < groups; ++g) {
    float* out = d + g * cols * kGroup;
    for (int64_t j0 = 0; j0 < cols; j0 += kCols) {
      const int64_t j1 = std::min(cols, j0 + kCols);
      for (int64_t r = 0; r < kGroup; ++r) {
        const int64_t row = g * kGroup + r;
        const float* src = w + row * cols;
        for (int64_t j = j0; j < j1; ++j) out[j * kGroup + r] = row < rows ? src[j] : 0.0f;
      }
    }
  }
}

void PackedMatrix::Row(int64_t r, float* out) const {
  const float* g = data_ + (r / kGroup) * cols_ * kGroup + r % kGroup;
  for (int64_t j = 0; j < cols_; ++j) out[j] = g[j * kGroup];
}

#if defined(__AVX512F__) || defined(SPECULA_AVX2)

bool PackedGemmAvailable() { return true; }

namespace {

constexpr int32_t kTileTokens = 6;  // the most tokens in one register tile (both ISAs)
constexpr int32_t kKChunk = 256;    // a group's 64 x 256 floats (64 KB) stay in L2 across token tiles
constexpr int32_t kSlices = PackedMatrix::kGroup / PackedMatrix::kSlice;

// Every loop over tokens, slices or halves of a tile is unrolled by pragma: without it, GCC 12 at -O3
// kept the accumulators in memory (a store after every FMA, half the speed on AVX2).
//
// A register tile: y[MR tokens, NV slices of 16 rows] (+)= x[MR, kc] w_chunk[kc, NV * 16]. `w` points
// at the first slice's rows within the group's [kc][64] chunk; valid[v] (0..16) is how many rows of
// slice v exist (rows past n are zero in the packed data and never stored). Each output lane is
// one chain of FMAs over k in order, on either ISA, so AVX2 and AVX-512 give the same bits.
//
// `ahead`, unless null, is memory the tile asks for into L2 as it goes, `ahead_step` bytes per step
// of k: the weights of the group that follows (see PackedGemm).
using TileFn = void (*)(const float* w, const float* x, int64_t ldx, int32_t kc, float* y, int64_t ldy,
                        const int32_t* valid, bool accumulate, const char* ahead, int32_t ahead_step);

// How many rows of the group ahead the tiles of several tokens prefetch. AVX2 (tiles of one or two
// slices): 16 (4 KB) gave 1.1-1.4x on 5- to 104-token products in gemm_bench against none; 8 and 32
// did no better. AVX-512 (whole rows): a 5-token product with its weights from memory read them at
// 15-20 GB/s without, 23-28 with (the 1-token one: 25-31), 32 rows doing no better.
constexpr int kPrefetchRows = 16;

#if defined(__AVX512F__)

// 32 registers: 6 x 4 accumulators + 4 weight vectors + 1 broadcast.
template <int MR, int NV>
void Tile(const float* w, const float* x, int64_t ldx, int32_t kc, float* y, int64_t ldy, const int32_t* valid,
          bool accumulate, const char* ahead, int32_t ahead_step) {
  __mmask16 mask[NV];
  #pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) mask[v] = static_cast<__mmask16>((1u << valid[v]) - 1);
  __m512 acc[MR][NV];
  #pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    #pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(mask[v], y + i * ldy + 16 * v) : _mm512_setzero_ps();
    }
  }
  for (int32_t kk = 0; kk < kc; ++kk) {
    const float* wk = w + static_cast<int64_t>(kk) * PackedMatrix::kGroup;
    if (ahead != nullptr) _mm_prefetch(ahead + ahead_step * kk, _MM_HINT_T1);  // the loop is unswitched
    if constexpr (MR > 1) {
      // Several tokens' FMAs per weight vector leave fewer loads in flight than the hardware
      // prefetcher needs to keep memory busy: the group's rows are asked for kPrefetchRows ahead.
      #pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        _mm_prefetch(reinterpret_cast<const char*>(wk + kPrefetchRows * PackedMatrix::kGroup + 16 * v), _MM_HINT_T0);
      }
    }
    __m512 wv[NV];
    #pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_load_ps(wk + 16 * v);
    #pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 b = _mm512_set1_ps(x[i * ldx + kk]);
      #pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(wv[v], b, acc[i][v]);
    }
  }
  #pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    #pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(y + i * ldy + 16 * v, mask[v], acc[i][v]);
  }
}

template <int MR>
constexpr std::array<TileFn, kSlices> TilesOf() {
  return {Tile<MR, 1>, Tile<MR, 2>, Tile<MR, 3>, Tile<MR, 4>};
}
constexpr std::array<TileFn, kSlices> kTiles[kTileTokens] = {TilesOf<1>(), TilesOf<2>(), TilesOf<3>(),
                                                             TilesOf<4>(), TilesOf<5>(), TilesOf<6>()};
// Slices per tile call, by tokens: every shape fits the registers.
constexpr int32_t MaxSlices(int32_t) { return kSlices; }

#else  // AVX2 + FMA

// A slice of 16 rows is two 8-lane vectors. 16 registers: 6 tokens x 2 accumulators + 2 weight
// vectors + 1 broadcast at most, so tiles of 3 to 6 tokens take one slice at a time, 2 tokens two
// slices, and 1 token four (8 independent chains, enough to hide the FMA latency at one token).
inline __m256i LaneMask(int32_t lanes) {  // the first `lanes` (clamped to 0..8) lanes set
  alignas(32) static const int32_t kOnes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kOnes + 8 - std::clamp(lanes, 0, 8)));
}


// The FMA loop alone, on accumulators the caller loads and stores.
template <int MR, int NH>
__attribute__((always_inline)) inline void TileLoop(const float* w, const float* x, int64_t ldx, int32_t kc,
                                                    __m256 (&acc)[MR][NH], const char* ahead, int32_t ahead_step) {
  for (int32_t kk = 0; kk < kc; ++kk) {
    const float* wk = w + static_cast<int64_t>(kk) * PackedMatrix::kGroup;
    if (ahead != nullptr) _mm_prefetch(ahead + ahead_step * kk, _MM_HINT_T1);  // the loop is unswitched
    if constexpr (NH <= 4) {
      // A tile of one or two slices reads one or two cache lines of each 256-byte row of the group:
      // a strided stream the hardware prefetcher follows poorly (the first weight load per row
      // stalled 80% of a 3-token product's time). Tiles of four slices read whole rows.
      #pragma GCC unroll 4
      for (int h = 0; h < NH; h += 2) {
        _mm_prefetch(reinterpret_cast<const char*>(wk + kPrefetchRows * PackedMatrix::kGroup + 8 * h), _MM_HINT_T0);
      }
    }
    __m256 wv[NH];
    #pragma GCC unroll 16
    for (int h = 0; h < NH; ++h) wv[h] = _mm256_load_ps(wk + 8 * h);
    #pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m256 b = _mm256_broadcast_ss(x + i * ldx + kk);
      #pragma GCC unroll 16
      for (int h = 0; h < NH; ++h) acc[i][h] = _mm256_fmadd_ps(wv[h], b, acc[i][h]);
    }
  }
}

template <int MR, int NV>
void Tile(const float* w, const float* x, int64_t ldx, int32_t kc, float* y, int64_t ldy, const int32_t* valid,
          bool accumulate, const char* ahead, int32_t ahead_step) {
  constexpr int NH = 2 * NV;  // 8-lane halves
  // Masked loads and stores only for the last slice of a matrix whose rows are not a multiple of
  // 16: a masked store is microcoded and slow on AMD.
  bool full = true;
  __m256i mask[NH];
  #pragma GCC unroll 16
  for (int h = 0; h < NH; ++h) {
    full = full && valid[h / 2] == 16;
    mask[h] = LaneMask(valid[h / 2] - 8 * (h % 2));
  }
  __m256 acc[MR][NH];
  #pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    #pragma GCC unroll 16
    for (int h = 0; h < NH; ++h) {
      float* p = y + i * ldy + 8 * h;
      acc[i][h] = !accumulate ? _mm256_setzero_ps() : full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask[h]);
    }
  }
  TileLoop<MR, NH>(w, x, ldx, kc, acc, ahead, ahead_step);
  #pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    #pragma GCC unroll 16
    for (int h = 0; h < NH; ++h) {
      float* p = y + i * ldy + 8 * h;
      full ? _mm256_storeu_ps(p, acc[i][h]) : _mm256_maskstore_ps(p, mask[h], acc[i][h]);
    }
  }
}

// kTiles[MR - 1][NV - 1]; the shapes past MaxSlices(MR) are never called (null).
template <int MR>
constexpr std::array<TileFn, kSlices> TilesOf() {
  if constexpr (MR == 1) return {Tile<1, 1>, Tile<1, 2>, Tile<1, 3>, Tile<1, 4>};
  if constexpr (MR == 2) return {Tile<2, 1>, Tile<2, 2>, nullptr, nullptr};
  return {Tile<MR, 1>, nullptr, nullptr, nullptr};
}
constexpr std::array<TileFn, kSlices> kTiles[kTileTokens] = {TilesOf<1>(), TilesOf<2>(), TilesOf<3>(),
                                                             TilesOf<4>(), TilesOf<5>(), TilesOf<6>()};
constexpr int32_t MaxSlices(int32_t mr) { return mr == 1 ? 4 : mr == 2 ? 2 : 1; }

#endif

// A block of `tokens` in as few register tiles as fit, of near-equal size: 32 tokens as 6, 6, 5, 5,
// 5, 5 rather than five tiles of 6 and one of 2, whose every weight vector (from L2) fed only two
// tokens' FMAs. Each output is the same chain of FMAs in whichever tile its token lands.
struct TokenTiles {
  int32_t n, base, extra;  // n tiles; the first `extra` of them hold base + 1 tokens, the others base
  explicit TokenTiles(int32_t tokens)
      : n((tokens + kTileTokens - 1) / kTileTokens), base(tokens / n), extra(tokens % n) {}
  int32_t size(int32_t i) const { return base + (i < extra ? 1 : 0); }
};

// Memory to ask for ahead of need, [next, end), a tile's share at a time.
struct Ahead {
  const char* next;
  const char* end;
  int32_t step;  // bytes per step of k
};

// y[mr, nv slices] through tiles of at most MaxSlices(mr) slices.
void RunTiles(int32_t mr, int32_t nv, const float* w, const float* x, int64_t ldx, int32_t kc, float* y, int64_t ldy,
              const int32_t* valid, bool accumulate, Ahead* ahead) {
  constexpr int32_t S = PackedMatrix::kSlice;
  const int32_t step = MaxSlices(mr);
  for (int32_t v = 0; v < nv; v += step) {
    const char* a = nullptr;
    if (ahead->next < ahead->end) {
      a = ahead->next;
      ahead->next += static_cast<int64_t>(kc) * ahead->step;
    }
    kTiles[mr - 1][std::min(step, nv - v) - 1](w + S * v, x, ldx, kc, y + S * v, ldy, valid + v, accumulate, a,
                                               ahead->step);
  }
}

// A unit of work: a 16-row slice of one output's group for one token block.
struct Unit {
  int32_t out, block, group, slice;
};

// Lists the units in order (output, token block, group, slice) into `list`; each weighs rows x
// tokens, so the total is m x all rows. Cuts them into `chunks` chunks of about equal work: chunk c
// is units [bounds[c], bounds[c + 1]), those whose midpoint falls in its share of the total. One
// chunk per thread for one token tile: finer chunks split a group's slices into tiles of fewer
// slices, and at one token a tile of one slice has too few FMA chains to hide their latency (0.68x
// on a 1-token down projection).
void ListUnits(const PackedOut* outs, int32_t num_outs, int32_t m, int32_t token_block, int32_t chunks,
               int64_t total, std::vector<Unit>* list, std::vector<int32_t>* bounds) {
  constexpr int32_t G = PackedMatrix::kGroup, S = PackedMatrix::kSlice;
  list->clear();
  bounds->clear();
  int64_t before = 0;  // work of the units listed so far
  int64_t c = 0;       // the chunk of the last unit: (2 before + w) chunks / (2 total), without a
                       // division per unit (a quarter of PackedGemm's own 1.7% of a batched run's
                       // samples sat at it; the classifier has 2,000 units)
  for (int32_t o = 0; o < num_outs; ++o) {
    const int32_t n = static_cast<int32_t>(outs[o].w->rows());
    for (int32_t tb = 0; tb * token_block < m; ++tb) {
      const int64_t tokens = std::min(m, (tb + 1) * token_block) - tb * token_block;
      for (int32_t r = 0; r < n; r += S) {
        const int64_t w = std::min(S, n - r) * tokens;
        // Past one token tile, a chunk starts only at a group's first slice: a group split between
        // chunks ran as tiles of 1 to 3 slices, whose weight vectors feed fewer FMAs (on AVX-512, 14%
        // of a 32-sequence batching run's samples; whole groups took the 32-token down projection
        // from 57 to 48 us, 103 to 82 us with its weights from DRAM). At one tile, slices still
        // split a group, so that a small matrix splits evenly between the threads.
        if (m <= kTileTokens || r % G == 0) {
          while ((2 * before + w) * chunks >= (c + 1) * 2 * total) ++c;
        }
        while (static_cast<int64_t>(bounds->size()) <= c) bounds->push_back(static_cast<int32_t>(list->size()));
        list->push_back(Unit{o, tb, r / G, (r % G) / S});
        before += w;
      }
    }
  }
  bounds->resize(chunks + 1, static_cast<int32_t>(list->size()));
}

// The bytes of the next group each tile asks for per step of k, so that a group's tiles (its
// token tiles times the tiles of each one's slices) cover the whole next group, at most a line
// per step. Tiles of fewer than 4 slices read a line or two of each 256-byte row of the group, a
// strided stream the hardware prefetcher follows poorly: on AVX2, a 3- or 5-token product with
// the classifier (37 MB, from DRAM) took 1.7-2x a 1-token one without it, 1.2-1.4x with it. One
// token tile of one or two tiles per group (1 and 2 tokens on AVX2, up to 6 on AVX-512) reads
// whole rows or halves, and asks for nothing.
int32_t AheadStep(int32_t m, int32_t token_block) {
  int32_t calls = 0;  // tiles per (group, k chunk) of a whole token block
  const TokenTiles first_tiles(std::min(m, token_block));
  for (int32_t i = 0; i < first_tiles.n; ++i) calls += kSlices / MaxSlices(first_tiles.size(i));
  constexpr int32_t kRowBytes = PackedMatrix::kGroup * sizeof(float);  // one step of k of a group
  return calls >= 3 ? std::clamp((kRowBytes / calls + 15) / 16 * 16, 16, 64) : m > kTileTokens ? 16 : 0;
}

// Runs run_chunk(c) for every chunk c, on every thread when `parallel`. Each thread runs its
// equal share of the chunks in order, then takes what is left of the others' shares from their
// ends: on a shared machine one core is often slower, and an equal static split left the faster one
// waiting at the barrier.
template <typename Fn>
void RunChunks(int32_t chunks, bool parallel, const Fn& run_chunk) {
  const auto claimed = std::make_unique<std::atomic<bool>[]>(chunks);  // all false
  auto claim = [&](int32_t c) { return !claimed[c].exchange(true, std::memory_order_relaxed); };
#pragma omp parallel if (parallel)
  {
    const int32_t me = omp_get_thread_num(), team = omp_get_num_threads();
    for (int32_t c = me * chunks / team; c < (me + 1) * chunks / team; ++c) {
      if (claim(c)) run_chunk(c);
    }
    for (int32_t d = 1; d < team; ++d) {
      const int32_t o = (me + d) % team;
      for (int32_t c = (o + 1) * chunks / team - 1; c >= o * chunks / team; --c) {
        if (claim(c)) run_chunk(c);
      }
    }
  }
}

}  // namespace

void PackedGemm(const float* x, int32_t m, const PackedOut* outs, int32_t num_outs) {
  if (m <= 0 || num_outs <= 0) return;
  constexpr int32_t G = PackedMatrix::kGroup, S = PackedMatrix::kSlice;
  const int32_t k = static_cast<int32_t>(outs[0].w->cols());
  // Blocks of up to 96 tokens keep a group's k-chunk in L2 across 16 tiles; without reuse across
  // token tiles (one tile), chunking k only adds accumulator traffic.
  const int32_t token_blocks = (m + 16 * kTileTokens - 1) / (16 * kTileTokens);
  const int32_t token_block = ((m + token_blocks - 1) / token_blocks + kTileTokens - 1) / kTileTokens * kTileTokens;
  // k of up to 384 in one pass: 288 cut into 256 + 32 spent a second pass of accumulator loads and
  // stores on 32 FMAs per lane.
  const int32_t k_pieces = (k + kKChunk - 1) / kKChunk;  // past 384: equal pieces of at most kKChunk
  const int32_t kchunk = m <= kTileTokens || k <= 384 ? k : (k + k_pieces - 1) / k_pieces;
  const int32_t chunks = (m > kTileTokens ? 8 : 1) * omp_get_max_threads();
  int64_t total = 0;
  for (int32_t o = 0; o < num_outs; ++o) total += outs[o].w->rows() * m;
  // The caller's scratch, reached through these references (a thread_local named inside the
  // parallel region would be each worker's own).
  thread_local std::vector<Unit> list_tls;
  thread_local std::vector<int32_t> bounds_tls;
  std::vector<Unit>& list = list_tls;
  std::vector<int32_t>& bounds = bounds_tls;
  ListUnits(outs, num_outs, m, token_block, chunks, total, &list, &bounds);
  const int32_t ahead_step = AheadStep(m, token_block);
  // Runs consecutive slices of one (output, block, group) as one tile of NV slices.
  auto run = [&](const Unit& u, int32_t nv) {
    const PackedOut& out = outs[u.out];
    const int32_t n = static_cast<int32_t>(out.w->rows()), r0 = u.group * G + u.slice * S;
    int32_t valid[kSlices];
    for (int v = 0; v < nv; ++v) valid[v] = std::clamp(n - r0 - S * v, 0, S);
    const float* wg = out.w->data() + static_cast<int64_t>(u.group) * k * G + u.slice * S;
    const int32_t t_begin = u.block * token_block, t_end = std::min(m, (u.block + 1) * token_block);
    const TokenTiles tiles(t_end - t_begin);
    // Past one token tile, a group's first tile reads its weights from memory (the layers' matrices
    // and the classifier stream from DRAM every step) and the others from L2: each tile asks for a
    // share of the next group's weights (ahead_step above), so that its first tile finds them in L2.
    Ahead ahead{nullptr, nullptr, ahead_step};
    if (ahead_step > 0 && (u.group + 1) * G < n) {
      ahead.next = reinterpret_cast<const char*>(out.w->data() + static_cast<int64_t>(u.group + 1) * k * G);
      ahead.end = ahead.next + static_cast<int64_t>(k) * G * sizeof(float);
    }
    for (int32_t k0 = 0; k0 < k; k0 += kchunk) {
      const int32_t kc = std::min(kchunk, k - k0);
      for (int32_t i = 0, t0 = t_begin; i < tiles.n; t0 += tiles.size(i++)) {
        RunTiles(tiles.size(i), nv, wg + static_cast<int64_t>(k0) * G,
                 x + static_cast<int64_t>(t0) * k + k0, k, kc, out.y + static_cast<int64_t>(t0) * n + r0, n, valid,
                 k0 > 0, &ahead);
      }
    }
    if (out.bias != nullptr) {
      for (int32_t t = t_begin; t < t_end; ++t) {
        for (int32_t r = r0; r < std::min(n, r0 + S * nv); ++r) out.y[static_cast<int64_t>(t) * n + r] += out.bias[r];
      }
    }
  };
  auto run_chunk = [&](int32_t c) {
    Unit first{-1, 0, 0, 0};
    int32_t nv = 0;
    for (int32_t i = bounds[c]; i < bounds[c + 1]; ++i) {
      const Unit& u = list[i];
      if (nv > 0 && u.out == first.out && u.block == first.block && u.group == first.group) {
        ++nv;
        continue;
      }
      if (nv > 0) run(first, nv);
      first = u;
      nv = 1;
    }
    if (nv > 0) run(first, nv);
  };
  RunChunks(chunks, total * k >= (1 << 14), run_chunk);
}

#else

bool PackedGemmAvailable() { return false; }

void PackedGemm(const float* x, int32_t m, const PackedOut* outs, int32_t num_outs) {
  for (int32_t o = 0; o < num_outs; ++o) {
    const PackedMatrix& w = *outs[o].w;
    const int64_t n = w.rows(), k = w.cols();
    std::unique_ptr<float[]> row(new float[k]);
    for (int64_t r = 0; r < n; ++r) {
      w.Row(r, row.get());
      for (int32_t i = 0; i < m; ++i) {
        float t = 0.0f;
        for (int64_t j = 0; j < k; ++j) t += x[i * k + j] * row[j];
        outs[o].y[i * n + r] = t + (outs[o].bias != nullptr ? outs[o].bias[r] : 0.0f);
      }
    }
  }
}

#endif

}  // namespace specula::cpu

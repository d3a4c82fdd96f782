// The CPU backend's paged attention in the shape of a batched decode step: 32 sequences of one new
// token each over contexts of 400, every layer of a stories15m-shape model (6 heads of 48, 6
// layers) through block tables scattered over one pool, f32 and bf16 KV. Reports the KV bytes read
// per second (the kernel is bound by them); the same for 8 sequences of 128, whose KV stays in the
// last-level cache; the 32-sequence step again with every sequence on the same blocks (the same work,
// its KV in cache); and a 512-token prefill chunk of one sequence.
//
//   build/release/bench/attention_bench
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_backend.h"

namespace specula {
namespace {

constexpr int32_t kBlockSize = 16;

// The model's attention shape: stories15m's (6 heads of 48, 6 layers) unless given.
struct Shape {
  int32_t layers = 6, heads = 6, kv_heads = 6, head_dim = 48;
};

// The pool comes from the backend (2 MB pages, as the engine's) unless `small_pages`, for comparison.
// `shared`: every sequence's table points at the first one's blocks, so its KV stays in cache.
void Attention(benchmark::State& state, int32_t seqs, int32_t new_tokens, int32_t ctx, bool small_pages = false,
               bool shared = false, Shape shape = {}) {
  const int32_t layers = shape.layers, heads = shape.heads, hd = shape.head_dim;
  const DType dtype = state.range(0) ? DType::kBF16 : DType::kF32;
  auto be = MakeCpuBackend();
  const int32_t per_seq = (ctx + kBlockSize - 1) / kBlockSize;
  const int32_t blocks = seqs * per_seq + 64;
  const int64_t row = static_cast<int64_t>(shape.kv_heads) * hd;  // one position's K (or V)
  const size_t layer_bytes = static_cast<size_t>(blocks) * kBlockSize * row * DTypeBytes(dtype);
  std::vector<char> small(small_pages ? 2 * layers * layer_bytes : 0);
  BackendBuffer huge;
  if (!small_pages && !huge.Grow(be.get(), 2 * layers * layer_bytes, nullptr, /*scattered=*/true).ok()) return state.SkipWithError("pool");
  char* const pool = small_pages ? small.data() : huge.as<char>();  // [2 * layers, layer_bytes]
  std::mt19937 rng(1);
  for (size_t i = 0; i < 2 * layers * layer_bytes; i += 2) {
    pool[i] = 0;
    pool[i + 1] = static_cast<char>(0x3c + rng() % 2);  // ~1.0 (both types)
  }
  std::vector<int32_t> perm(blocks), tables(static_cast<size_t>(seqs) * per_seq), positions, query_start, slots;
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);  // blocks scattered over the pool, as after a long run
  std::copy(perm.begin(), perm.begin() + tables.size(), tables.begin());
  if (shared) {
    for (size_t i = per_seq; i < tables.size(); ++i) tables[i] = tables[i % per_seq];
  }
  for (int32_t s = 0; s < seqs; ++s) {
    query_start.push_back(static_cast<int32_t>(positions.size()));
    for (int32_t t = 0; t < new_tokens; ++t) positions.push_back(ctx - new_tokens + t);
  }
  const int32_t tokens = static_cast<int32_t>(positions.size());
  query_start.push_back(tokens);
  slots.assign(tokens, -1);
  AttentionMetadata meta{seqs, tokens, query_start.data(), positions.data(), slots.data(), tables.data(), per_seq};
  std::vector<float> q(static_cast<size_t>(tokens) * heads * hd, 0.1f), out(q.size());
  int64_t positions_read = 0;
  for (int32_t p : positions) positions_read += p + 1;
  for (auto _ : state) {
    for (int32_t l = 0; l < layers; ++l) {
      char* k = pool + 2 * l * layer_bytes;
      const PagedKvLayer kv{k, k + layer_bytes, blocks, kBlockSize, shape.kv_heads, hd, dtype};
      be->PagedAttention(q.data(), kv, meta, heads, 0.144f, out.data());
    }
  }
  // Each new token reads its context's K and V in every layer (a prefill chunk's tokens share theirs).
  const double bytes = 2.0 * layers * row * DTypeBytes(dtype) * (new_tokens == 1 ? positions_read : seqs * ctx);
  state.counters["KV_GB/s"] = benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_DecodeAttention(benchmark::State& state) { Attention(state, 32, 1, 400); }
BENCHMARK(BM_DecodeAttention)->ArgName("kv_bf16")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same in 4 KB pages: most of a scattered block's pages miss the TLB.
void BM_DecodeAttentionSmallPages(benchmark::State& state) { Attention(state, 32, 1, 400, true); }
BENCHMARK(BM_DecodeAttentionSmallPages)->ArgName("kv_bf16")->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// Eight sequences of 128: their KV (7 MB in bf16) stays in the last-level cache, so this is the kernel's
// compute rate, for comparison with the streamed case above.
void BM_DecodeAttentionInCache(benchmark::State& state) { Attention(state, 8, 1, 128); }
BENCHMARK(BM_DecodeAttentionInCache)->ArgName("kv_bf16")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The decode step above with every sequence reading one sequence's blocks (2.7 MB of bf16 KV, in the
// last-level cache): the same work without the memory traffic. The time above less this one is what
// the kernel waits for memory.
void BM_DecodeAttentionShared(benchmark::State& state) { Attention(state, 32, 1, 400, false, true); }
BENCHMARK(BM_DecodeAttentionShared)->ArgName("kv_bf16")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_PrefillAttention(benchmark::State& state) { Attention(state, 1, 512, 512); }
BENCHMARK(BM_PrefillAttention)->ArgName("kv_bf16")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// One sequence's decode (1 token), verification (5: k = 4 drafts) and a 600-token prefill chunk
// over 128 positions before them, every layer of SmolLM2-135M (30 layers, 9 query heads on 3 KV
// heads of 64): what a verification step adds to a decode step's attention, and a prompt's.
void BM_VerifyAttention(benchmark::State& state) {
  const int32_t tokens = static_cast<int32_t>(state.range(1));
  Attention(state, 1, tokens, 128 + tokens, false, false, {.layers = 30, .heads = 9, .kv_heads = 3, .head_dim = 64});
}
BENCHMARK(BM_VerifyAttention)
    ->ArgNames({"kv_bf16", "tokens"})
    ->ArgsProduct({{0, 1}, {1, 5, 600}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

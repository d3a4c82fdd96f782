// LinearQuant (kernels/cpu/quant_gemm.h) at SmolLM2-135M's shapes, in GB/s of weights read,
// against this machine's memory bandwidth measured in the same run:
//
//  BM_StreamSum                  GB/s of a float sum over 1 GiB, every thread: the read bound.
//  BM_Int8Peak                   GOP/s of independent vpdpbusd chains, every thread: the int8 bound.
//  BM_AmxPeak                    GOP/s of tdpbssd on 4 independent tiles, every thread: AMX's int8
//                                bound (machines with AMX; the products use it from 4 rows on, the
//                                label says "AMX"; SPECULA_NO_AMX=1 gives the vector path to compare).
//  BM_Linear/type:T/shape:S/tokens:M/cold:C/terms:A
//                                y[M, n] = x[M, k] w^T for the weight type T (QuantType id, 0 =
//                                f32 through StreamGemm, the float path), shape S of kShapes below,
//                                A = 1: activations as one 8-bit term per group (llama.cpp's way),
//                                2: two terms (QuantMatrix::two_term_activations, the default).
//                                cold:0 multiplies one matrix over and over (it stays in L2 or the
//                                LLC); cold:1 goes round a 1 GiB set of copies of it, so that every
//                                call reads its weights from memory as a decode step does on a
//                                model larger than the LLC. Q4_K and Q6_K need k % 256 == 0: only
//                                576x1536 (their rows of 576 are not a whole number of superblocks).
//
//   OMP_NUM_THREADS=2 build/release/bench/quant_gemm_bench
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/quant_gemm.h"
#include "kernels/cpu/stream_gemm.h"
#include "kernels/cpu/tile_gemm.h"

namespace specula {
namespace {

constexpr int64_t kColdBytes = int64_t{1} << 30;

struct Shape {
  int32_t n, k;
  const char* what;
};
const Shape kShapes[] = {{576, 576, "q/o"}, {192, 576, "k/v"}, {1536, 576, "gate/up"},
                         {576, 1536, "down"}, {49152, 576, "lm head"}};

// Random blocks with sane f16 scales (random bytes there could be inf or NaN).
std::vector<uint8_t> RandomWeights(QuantType type, int64_t n, int64_t k) {
  std::mt19937_64 rng(1);
  std::vector<uint8_t> bytes(static_cast<size_t>(QuantRowBytes(type, k) * n));
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(&bytes[i], &r, 8);
  }
  std::uniform_real_distribution<float> scale(0.001f, 0.05f), value(-1.0f, 1.0f);
  const auto put = [&](size_t at, uint16_t h) { std::memcpy(&bytes[at], &h, 2); };
  const size_t block = static_cast<size_t>(QuantBlockBytes(type));
  for (size_t b = 0; b < bytes.size(); b += block) {
    switch (type) {
      case QuantType::kQ4_1:
      case QuantType::kQ4_K:
        put(b, F32ToF16(scale(rng)));
        put(b + 2, F32ToF16(scale(rng)));
        break;
      case QuantType::kQ4_0:
      case QuantType::kQ8_0: put(b, F32ToF16(scale(rng))); break;
      case QuantType::kQ6_K: put(b + offsetof(BlockQ6_K, d), F32ToF16(scale(rng))); break;
      case QuantType::kF16: put(b, F32ToF16(value(rng))); break;
      case QuantType::kBF16: put(b, F32ToBf16(value(rng))); break;
      case QuantType::kF32: {
        const float f = value(rng);
        std::memcpy(&bytes[b], &f, 4);
        break;
      }
      default: break;
    }
  }
  return bytes;
}

void BM_StreamSum(benchmark::State& state) {
  std::vector<float> a(static_cast<size_t>(kColdBytes / 4));
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i & 1023);  // pages on every thread's node
  for (auto _ : state) {
    float sum = 0.0f;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
    for (size_t i = 0; i < a.size(); ++i) sum += a[i];
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * kColdBytes);
}
BENCHMARK(BM_StreamSum)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

// The int8 bound: GOP/s (a multiply and an add each) of 12 independent vpdpbusd chains per thread
// (u8 x s8 dot products of 4, VNNI, the instruction of the quantized products), every thread.
void BM_Int8Peak(benchmark::State& state) {
#if defined(__AVX512VNNI__)
  constexpr int64_t kIters = 20'000'000;
  for (auto _ : state) {
    const double t0 = omp_get_wtime();
    int64_t sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
      __m512i acc[12];
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
      __m512i a = _mm512_set1_epi8(3);
      const __m512i b = _mm512_set1_epi8(5);
      for (int64_t it = 0; it < kIters; ++it) {
        for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
        asm volatile("" : "+v"(a));  // one chain per accumulator, not folded
      }
      alignas(64) int32_t lanes[16];
      for (int i = 0; i < 12; ++i) {
        _mm512_store_si512(lanes, acc[i]);  // (GCC 12's reduce intrinsic warns, bug 105593)
        for (int32_t v : lanes) sink += v;
      }
    }
    const double seconds = omp_get_wtime() - t0;
    benchmark::DoNotOptimize(sink);
    state.counters["GOP/s"] = 2.0 * 64 * 12 * kIters * omp_get_max_threads() / seconds / 1e9;
  }
#else
  state.SkipWithError("no AVX-512 VNNI on this build");
#endif
}
BENCHMARK(BM_Int8Peak)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

// AMX's int8 bound: tdpbssd into 4 accumulators (tiles 4-7) from two 16 x 64-byte tiles, each a
// 16 x 16 x 64 dot product, every thread (each configures its own tiles).
void BM_AmxPeak(benchmark::State& state) {
  if (!cpu::amx::Usable()) return state.SkipWithError("no AMX here (or Linux refused it, or SPECULA_NO_AMX is set)");
  constexpr int64_t kIters = 2'000'000;
  for (auto _ : state) {
    const double t0 = omp_get_wtime();
#pragma omp parallel
    {
      alignas(64) uint8_t config[64] = {}, src[16 * 64] = {};
      config[0] = 1;
      for (int t = 0; t < 8; ++t) config[16 + 2 * t] = 64, config[48 + t] = 16;
      asm volatile("ldtilecfg %0" ::"m"(config) : "memory");
      asm volatile("tileloadd (%0,%1,1), %%tmm0\n\ttileloadd (%0,%1,1), %%tmm1" ::"r"(src), "r"(64L) : "memory");
      for (int64_t it = 0; it < kIters; ++it) {
        asm volatile(
            "tdpbssd %%tmm1, %%tmm0, %%tmm4\n\ttdpbssd %%tmm1, %%tmm0, %%tmm5\n\t"
            "tdpbssd %%tmm1, %%tmm0, %%tmm6\n\ttdpbssd %%tmm1, %%tmm0, %%tmm7" ::);
      }
      asm volatile("tilerelease" ::);
    }
    const double seconds = omp_get_wtime() - t0;
    state.counters["GOP/s"] = 2.0 * 16 * 16 * 64 * 4 * kIters * omp_get_max_threads() / seconds / 1e9;
  }
}
BENCHMARK(BM_AmxPeak)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Linear(benchmark::State& state) {
  const auto type = static_cast<QuantType>(state.range(0));
  const Shape s = kShapes[state.range(1)];
  const int32_t m = static_cast<int32_t>(state.range(2));
  const bool cold = state.range(3) != 0, two_term = state.range(4) == 2;
  if (s.k % QuantBlockSize(type) != 0) return state.SkipWithError("k is not a whole number of blocks");
  std::vector<uint8_t> one = RandomWeights(type, s.n, s.k);
  // In the arrangement the CPU backend multiplies (Q4_1 and Q8_0 repacked), and with its bytes.
  std::vector<uint8_t> packed = cpu::RepackForProducts(cpu::QuantMatrix{one.data(), type, s.n, s.k, two_term});
  const bool repacked = !packed.empty();
  if (repacked) one = std::move(packed);
  const int64_t copies = cold ? std::max<int64_t>(2, kColdBytes / static_cast<int64_t>(one.size())) : 1;
  std::vector<uint8_t> all(one.size() * copies);
  for (int64_t c = 0; c < copies; ++c) std::memcpy(all.data() + c * one.size(), one.data(), one.size());
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m) * s.k), y(static_cast<size_t>(m) * s.n);  // [m, k], [m, n]
  for (float& v : x) v = normal(rng);
  int64_t c = 0;
  for (auto _ : state) {
    const uint8_t* w = all.data() + c * one.size();
    if (type == QuantType::kF32) {
      cpu::StreamGemm(x.data(), m, s.k, reinterpret_cast<const float*>(w), nullptr, s.n, y.data(), nullptr);
    } else {
      cpu::LinearQuant(x.data(), cpu::QuantMatrix{w, type, s.n, s.k, two_term, repacked}, nullptr, m, s.n, s.k,
                       y.data());
    }
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(one.size()));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * s.n * s.k * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  const char* acts = QuantBlockSize(type) == 1 ? "" : two_term ? " 2x8b" : " 8b";
  const bool amx = repacked && cpu::AmxServes((two_term ? 2 : 1) * m);
  state.SetLabel(std::string(QuantTypeName(type)) + " " + s.what + acts + (amx ? " AMX" : ""));
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  for (QuantType t : {QuantType::kQ4_0, QuantType::kQ4_1, QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ6_K,
                      QuantType::kF16, QuantType::kBF16, QuantType::kF32}) {
    for (int s = 0; s < 5; ++s) {
      if (kShapes[s].k % QuantBlockSize(t) != 0) continue;
      for (int terms : {1, 2}) {
        if (terms == 2 && QuantBlockSize(t) == 1) continue;  // float activations
        for (int cold : {0, 1}) b->Args({static_cast<int64_t>(t), s, 1, cold, terms});
      }
    }
  }
}
BENCHMARK(BM_Linear)
    ->ArgNames({"type", "shape", "tokens", "cold", "terms"})
    ->Apply(DecodeArgs)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Verification runs (5 tokens: k = 4) and prefill chunks: the weights are unpacked once per block of up to 16 activation rows.
void BatchArgs(benchmark::internal::Benchmark* b) {
  for (QuantType t : {QuantType::kQ4_1, QuantType::kQ8_0, QuantType::kF32}) {
    for (int s : {0, 2, 3}) {
      for (int m : {5, 8, 64}) {
        for (int terms : {1, 2}) {
          if (terms == 1 || t != QuantType::kF32) b->Args({static_cast<int64_t>(t), s, m, 0, terms});
        }
      }
    }
  }
}
BENCHMARK(BM_Linear)
    ->ArgNames({"type", "shape", "tokens", "cold", "terms"})
    ->Apply(BatchArgs)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

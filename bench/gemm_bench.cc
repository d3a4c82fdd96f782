// The CPU backend's packed f32 GEMM (AVX-512) at the shapes of a stories15m-shape batched step,
// against this machine's FMA peak measured in the same run (both cores, a register-only FMA loop):
//
//  BM_FmaPeak                    GFLOP/s of independent FMA chains, every thread.
//  BM_Gemm/tokens:M/matrix:W     y[M, n] = x[M, k] w^T for the step's matrices, W = 0: Q/K/V
//                                (3 x 288x288, fused), 1: gate/up (2 x 768x288), 2: down (288x768),
//                                3: the classifier (32000x288). Reports GFLOP/s and the share of peak.
//
//   build/release/bench/gemm_bench
#include <benchmark/benchmark.h>

#include <omp.h>

#include <random>
#include <vector>

#include "kernels/cpu/packed_gemm.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace specula {
namespace {

// GFLOP/s of 12 independent 16-lane FMA chains per thread, every thread: the arithmetic bound.
double MeasurePeak() {
#if defined(__AVX512F__)
  constexpr int64_t kIters = 20'000'000;
  double seconds = 0;
  const auto t0 = omp_get_wtime();
  float sink = 0;
#pragma omp parallel reduction(+ : sink)
  {
    __m512 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
    const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.0001f);
    for (int64_t it = 0; it < kIters; ++it) {
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
    alignas(64) float lanes[16];
    for (int i = 0; i < 12; ++i) {
      _mm512_store_ps(lanes, acc[i]);
      for (float v : lanes) sink += v;
    }
  }
  seconds = omp_get_wtime() - t0;
  benchmark::DoNotOptimize(sink);
  return 2.0 * 16 * 12 * kIters * omp_get_max_threads() / seconds / 1e9;
#else
  return 0;
#endif
}

double Peak() {
  static const double peak = [] {
    double best = 0;
    for (int i = 0; i < 3; ++i) best = std::max(best, MeasurePeak());
    return best;
  }();
  return peak;
}

void BM_FmaPeak(benchmark::State& state) {
  for (auto _ : state) state.counters["GFLOP/s"] = MeasurePeak();
}
BENCHMARK(BM_FmaPeak)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Gemm(benchmark::State& state) {
  if (!cpu::PackedGemmAvailable()) return state.SkipWithError("the packed GEMM needs AVX-512");
  const int32_t m = static_cast<int32_t>(state.range(0));
  struct Shape {
    int64_t n, k;
    int count;
  };
  const Shape shapes[] = {{288, 288, 3}, {768, 288, 2}, {288, 768, 1}, {32000, 288, 1}};
  const Shape s = shapes[state.range(1)];
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w(s.n * s.k), x(static_cast<size_t>(m) * s.k);  // w[n, k], x[m, k]
  for (float& v : w) v = u(rng);
  for (float& v : x) v = u(rng);
  cpu::PackedArena arena;
  std::vector<cpu::PackedMatrix> mats;
  for (int i = 0; i < s.count; ++i) mats.emplace_back(w.data(), s.n, s.k, &arena);
  std::vector<std::vector<float>> ys(s.count, std::vector<float>(static_cast<size_t>(m) * s.n));  // [m, n] each
  std::vector<cpu::PackedOut> outs;
  for (int i = 0; i < s.count; ++i) outs.push_back({&mats[i], nullptr, ys[i].data()});
  for (auto _ : state) cpu::PackedGemm(x.data(), m, outs.data(), s.count);
  const double flops = 2.0 * m * s.n * s.k * s.count;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["peak_GFLOP/s"] = Peak();
}
BENCHMARK(BM_Gemm)
    ->ArgNames({"tokens", "matrix"})
    ->ArgsProduct({{1, 32, 104, 512}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

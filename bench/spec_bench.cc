// Speculative decoding benchmarks.
//
//  BM_Acceptance/temp:T/k:K  the real pair (stories260K target, llama2xs draft) on 100 prompts:
//                            acceptance per position and mean acceptance length. Not a speed test.
//  BM_Synthetic/k:K/batch:B  cost study with the synthetic proposer (each draft accepted with
//                            probability alpha = 0.8, NOT lossless): a llama-3.2-1b-shape target and
//                            a 2-layer draft of the same vocabulary, random weights; generated
//                            tokens/s. k = 0 is plain decoding. Needs ~8 GB of RAM and disk in
//                            $TMPDIR for the models (written once).
//
//                            The grid uses the int8 draft and 32 tokens per request.
//  BM_SyntheticSideBySide    the acceptance figure: k = 0 and k = 4 at batch 1 alternated in one
//                            run, 128 tokens per request, with the draft in f32 and in int8.
//  BM_ForwardCost            one forward of 1 or 5 tokens of the draft, the target, the int8 draft.
//
//   build/release/bench/spec_bench --benchmark_filter=Acceptance
//   build/release/bench/spec_bench --benchmark_filter='Synthetic/k:(0|4)/batch:1$'
//   build/release/bench/spec_bench --benchmark_filter=SyntheticSideBySide
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "bench/bench_models.h"
#include "draft/draft_model_proposer.h"
#include "engine/engine.h"
#include "model/make_model.h"
#include "model/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"

namespace specula {
namespace {

std::unique_ptr<LlamaModel> Load(const std::string& path, bool int8_weights = false) {
  auto w = LoadModel(path);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", std::string(w.status().message()).c_str());
    std::exit(1);
  }
  return std::make_unique<LlamaModel>(std::move(w).value(), MakeCpuBackend({int8_weights}));
}

void BM_Acceptance(benchmark::State& state) {
  static auto target = Load(bench::TinyStories("stories260K.bin"));
  static auto draft = Load(bench::TinyStories("llama2xs.bin"));
  static auto tok = LoadTokenizer(bench::TinyStories("tok512.bin"), 512);
  const float temperature = static_cast<float>(state.range(0));
  const int32_t k = static_cast<int32_t>(state.range(1));
  for (auto _ : state) {
    DraftModelProposer proposer(draft.get(), 16, 1024);
    SchedulerConfig c;
    c.max_num_seqs = 32;
    c.num_blocks = 1024;
    c.max_model_len = 256;  // the draft's context
    c.num_spec_tokens = k;
    Engine e(target.get(), nullptr, c, {&proposer});
    const std::vector<std::string> starts = {"Once upon a time", "Lily and Ben", "The little dog", "One day, Tom",
                                             "There was a big tree", "Sue had a red ball", "The sun was hot",
                                             "Mom said", "A bird sat on", "The cat and the mouse"};
    for (int i = 0; i < 100; ++i) {
      Request r;
      r.id = i;
      r.prompt = (*tok)->Encode(starts[i % 10], true);
      r.max_tokens = 128;
      r.sampling.temperature = temperature;
      r.sampling.seed = i;
      r.ignore_eos = true;
      if (!e.AddRequest(r).ok()) state.SkipWithError("add");
    }
    while (e.HasUnfinished()) e.Step();
    const SpecStats& s = e.stats().spec;
    state.counters["mean_acceptance_length"] = s.mean_acceptance_length();
    state.counters["acceptance_rate"] = s.acceptance_rate();
    for (size_t i = 0; i < s.accepted_per_position.size(); ++i) {
      state.counters[absl::StrCat("accept@", i + 1)] = static_cast<double>(s.accepted_per_position[i]) / s.drafts;
    }
  }
}
BENCHMARK(BM_Acceptance)->ArgNames({"temp", "k"})->ArgsProduct({{0, 1}, {1, 2, 3, 4, 5, 6, 7, 8}})->Iterations(1)->Unit(benchmark::kSecond);

std::string SyntheticModel(const std::string& name, int32_t layers) {
  ModelConfig c = *NamedShape("llama-3.2-1b");
  c.num_layers = layers;
  c.max_seq_len = 1024;
  return bench::RandomModel(name, c, DType::kBF16, layers);
}

LlamaModel& SyntheticTarget() {
  static auto target = Load(SyntheticModel("llama-3.2-1b", 16));
  return *target;
}
// The 2-layer draft with f32 weights, or with weight-only int8 (--draft-quantization int8).
LlamaModel& SyntheticDraft(bool int8 = false) {
  if (int8) {
    static auto draft_q8 = Load(SyntheticModel("llama-3.2-1b-2layer", 2), true);
    return *draft_q8;
  }
  static auto draft = Load(SyntheticModel("llama-3.2-1b-2layer", 2));
  return *draft;
}

struct SyntheticResult {
  int64_t tokens = 0;
  double ms = 0;
  double mean_acceptance_length = 0;
};

// `batch` requests of max_tokens (<= 128) tokens with k drafts per step (k = 0: plain decoding); the prefill step
// is not timed.
absl::StatusOr<SyntheticResult> RunSynthetic(int32_t k, int32_t batch, bool int8_draft, int32_t max_tokens) {
  LlamaModel& target = SyntheticTarget();
  DraftModelProposer proposer(&SyntheticDraft(int8_draft), 16, batch * 10 + 8);
  SchedulerConfig c;
  c.max_num_seqs = batch;
  c.num_blocks = batch * 10 + 8;  // 4 prompt + 128 generated + 9 lookahead tokens in blocks of 16
  c.max_model_len = 160;
  c.num_spec_tokens = k;
  Engine e(&target, nullptr, c, {k > 0 ? &proposer : nullptr, k > 0 ? 0.8 : -1.0, true});
  for (int i = 0; i < batch; ++i) {
    Request r;
    r.id = i;
    r.prompt = {1 + i, 2, 3, 4};
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    if (auto st = e.AddRequest(r); !st.ok()) return st;
  }
  e.Step();  // prefill, not timed
  const int64_t before = e.stats().generated_tokens;
  const double t0 = e.NowMs();
  while (e.HasUnfinished()) e.Step();
  return SyntheticResult{e.stats().generated_tokens - before, e.NowMs() - t0, e.stats().spec.mean_acceptance_length()};
}

// The grid: 32 tokens per request (the side-by-side figure uses 128), the int8 draft.
void BM_Synthetic(benchmark::State& state) {
  const int32_t k = static_cast<int32_t>(state.range(0));
  const int32_t batch = static_cast<int32_t>(state.range(1));
  for (auto _ : state) {
    auto r = RunSynthetic(k, batch, true, 32);
    if (!r.ok()) return state.SkipWithError(std::string(r.status().message()).c_str());
    state.counters["tokens/s"] = r->tokens / (r->ms / 1000);
    state.counters["mean_acceptance_length"] = r->mean_acceptance_length;
  }
}
BENCHMARK(BM_Synthetic)->ArgNames({"k", "batch"})->ArgsProduct({{0, 1, 2, 4, 8}, {1, 8, 32}})->Iterations(1)->Unit(benchmark::kSecond);

// The acceptance figure: plain decoding and k = 4 at batch 1, alternated 5 times in one run so
// all see the same machine load; speedup = speculative tokens/s over plain tokens/s. The draft's
// weights are f32 (draft_int8:0) or weight-only int8 (draft_int8:1); the target is f32 in both.
void BM_SyntheticSideBySide(benchmark::State& state) {
  const bool int8 = state.range(0) != 0;
  for (auto _ : state) {
    SyntheticResult plain, spec;
    for (int round = 0; round < 5; ++round) {
      for (int32_t k : {0, 4}) {
        auto r = RunSynthetic(k, 1, int8, 128);
        if (!r.ok()) return state.SkipWithError(std::string(r.status().message()).c_str());
        SyntheticResult& acc = k == 0 ? plain : spec;
        acc.tokens += r->tokens;
        acc.ms += r->ms;
        acc.mean_acceptance_length = r->mean_acceptance_length;
      }
    }
    const double plain_tps = plain.tokens / (plain.ms / 1000), spec_tps = spec.tokens / (spec.ms / 1000);
    state.counters["plain_tok/s"] = plain_tps;
    state.counters["spec_k4_tok/s"] = spec_tps;
    state.counters["speedup"] = spec_tps / plain_tps;
    state.counters["mean_acceptance_length"] = spec.mean_acceptance_length;
  }
}
BENCHMARK(BM_SyntheticSideBySide)->ArgName("draft_int8")->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kSecond);

// The costs behind the synthetic grid: one forward of `tokens` new tokens for one sequence.
void BM_ForwardCost(benchmark::State& state) {
  LlamaModel& m = state.range(0) == 1 ? SyntheticTarget() : SyntheticDraft(state.range(0) == 2);
  const int32_t tokens = static_cast<int32_t>(state.range(1));
  KvCache kv(m.config(), {16, 8});
  std::vector<BlockId> table = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<TokenId> ids(tokens, 5);
  std::vector<float> logits;
  for (auto _ : state) {
    ForwardBatch b;
    b.seqs.push_back({ids, 64, table, true});
    if (!m.Forward(b, kv, LogitsMode::kLastPerSequence, &logits).ok()) state.SkipWithError("forward");
  }
}
// model: 0 the draft, 1 the target, 2 the draft with int8 weights.
BENCHMARK(BM_ForwardCost)->ArgNames({"model", "tokens"})->ArgsProduct({{0, 1, 2}, {1, 5}})->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

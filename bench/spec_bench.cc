// Speculative decoding benchmarks.
//
//  BM_Acceptance/temp:T/k:K  the real pair (stories260K target and its draft, models/tinystories) on 100 prompts:
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
//  BM_SpecGrid/pair:P/batch:B
//                            throughput with no speculation, each fixed k in {1, 2, 4, 8} and
//                            --num-spec-tokens auto, side by side: the six runs alternate (no
//                            speculation and auto back to back), five rounds
//                            ($SPECULA_GRID_ROUNDS), in one benchmark; each one's best round
//                            is reported, and the ratios are medians of each round's ratio (against
//                            the fixed k of highest median). P = 0: the real pair (stories260K target,
//                            its draft, greedy). P = 1: the synthetic proposer at alpha = 0.8
//                            on a stories15m-shape target (f32, random weights) with a 2-layer,
//                            64-wide draft of the same vocabulary (a tenth of the target's bytes).
//                            4 x B requests of 128 tokens (the real pair: at least 32) run, B at a
//                            time. $SPECULA_GRID_KS (e.g. "0,-1") runs a subset of the k values. Reports tokens/s of each, and
//                            auto over no speculation and over the best fixed k.
//
//   build/release/bench/spec_bench --benchmark_filter=Acceptance
//   build/release/bench/spec_bench --benchmark_filter='Synthetic/k:(0|4)/batch:1$'
//   build/release/bench/spec_bench --benchmark_filter=SyntheticSideBySide
//   build/release/bench/spec_bench --benchmark_filter=SpecGrid
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_models.h"
#include "draft/draft_model_proposer.h"
#include "engine/engine.h"
#include "model/make_model.h"
#include "tokenizer/tokenizer.h"
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
  static auto draft = Load(bench::TinyStories("stories260K-draft.bin"));
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

// The grid's models: the real pair, or the stories15m-shape target and its small synthetic draft.
struct GridModels {
  LlamaModel* target;
  LlamaModel* draft;
  std::vector<std::vector<TokenId>> prompts;
  int32_t max_model_len;
};

GridModels RealPair() {
  static auto target = Load(bench::TinyStories("stories260K.bin"));
  static auto draft = Load(bench::TinyStories("stories260K-draft.bin"));
  static auto tok = LoadTokenizer(bench::TinyStories("tok512.bin"), 512);
  std::vector<std::vector<TokenId>> prompts;
  for (const char* p : {"Once upon a time", "Lily and Ben", "The little dog", "One day, Tom", "There was a big tree",
                        "Sue had a red ball", "The sun was hot", "Mom said", "A bird sat on", "The cat and the mouse"}) {
    prompts.push_back((*tok)->Encode(p, true));
  }
  return {target.get(), draft.get(), prompts, 256};  // the draft's context
}

GridModels Stories15mSynthetic() {
  auto load = [](const std::string& name, ModelConfig c) {
    c.max_seq_len = 1024;
    return Load(bench::RandomModel(name, c, DType::kF32, 3));
  };
  static auto target = load("stories15m-ctx1024-f32", *NamedShape("stories15m"));
  static auto draft = [&] {
    ModelConfig c = *NamedShape("stories15m");
    c.dim = 64;
    c.hidden_dim = 172;
    c.num_layers = 2;
    c.num_heads = c.num_kv_heads = 4;
    c.head_dim = 16;
    return load("stories15m-draft-64x2", c);
  }();
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 10; ++i) prompts.push_back({1, 100 + i, 200 + 3 * i, 300 + 7 * i});
  return {target.get(), draft.get(), prompts, 1024};
}

struct GridRun {
  double tokens_per_s = 0;
  double spec_off = 0;   // share of steps that speculated on no sequence
  double mean_k = 0;     // drafts per decoding sequence-step
  bool cannot_pay = false;  // auto found that no acceptance would make drafts pay
};

// One run: 4 x `batch` requests of 128 tokens, `batch` at a time, with k drafts per step (0: none,
// -1: auto).
// Returns generated tokens per second of the step loop (the engine's startup, auto's cost
// measurement included, is not timed).
GridRun RunGrid(const GridModels& m, bool synthetic, int32_t batch, int32_t k) {
  DraftModelProposer proposer(m.draft, 16, batch * 12 + 16);
  SchedulerConfig c;
  c.max_num_seqs = batch;
  c.num_blocks = batch * 12 + 16;  // prompt + 128 tokens + 8 lookahead in blocks of 16
  c.max_model_len = m.max_model_len;
  c.num_spec_tokens = k < 0 ? 8 : k;
  SpecConfig spec;
  spec.proposer = k != 0 ? &proposer : nullptr;
  spec.synthetic_alpha = synthetic && k != 0 ? 0.8 : -1.0;
  spec.allow_synthetic = true;
  spec.adaptive = k < 0;
  Engine e(m.target, nullptr, c, spec);
  if (!e.Validate().ok()) return {};
  // `batch` at a time, four times over; the real pair's steps take ~50 us, so it runs at least 32
  // requests (4096 tokens): runs of 30 ms varied by +-10% between identical settings.
  const int requests = synthetic ? 4 * batch : std::max(4 * batch, 32);
  for (int i = 0; i < requests; ++i) {
    Request r;
    r.id = i;
    r.prompt = m.prompts[i % m.prompts.size()];
    r.max_tokens = 128;
    r.ignore_eos = true;
    r.sampling.seed = i;
    if (!e.AddRequest(r).ok()) return {};
  }
  const double t0 = e.NowMs();
  while (e.HasUnfinished()) e.Step();
  const EngineStats& st = e.stats();
  double seq_steps = 0, drafts = 0;
  for (size_t j = 0; j < st.spec_k_histogram.size(); ++j) {
    seq_steps += st.spec_k_histogram[j];
    drafts += j * static_cast<double>(st.spec_k_histogram[j]);
  }
  return {st.generated_tokens / ((e.NowMs() - t0) / 1000), static_cast<double>(st.spec_off_steps) / std::max<int64_t>(st.decode_steps, 1),
          drafts / std::max(seq_steps, 1.0), st.drafts_cannot_pay};
}

void BM_SpecGrid(benchmark::State& state) {
  const bool synthetic = state.range(0) != 0;
  const int32_t batch = static_cast<int32_t>(state.range(1));
  const GridModels m = synthetic ? Stories15mSynthetic() : RealPair();
  std::vector<int32_t> ks = {0, 1, 2, 4, 8, -1};
  if (const char* env = std::getenv("SPECULA_GRID_KS")) {  // e.g. "0,-1": a subset, for profiling
    ks.clear();
    const std::vector<std::string> parts = absl::StrSplit(env, ',');
    for (const std::string& k : parts) ks.push_back(std::atoi(k.c_str()));
  }
  for (auto _ : state) {
    std::map<int32_t, std::vector<double>> tps;
    GridRun last_auto;
    const char* env = std::getenv("SPECULA_GRID_ROUNDS");
    const int rounds = env != nullptr ? std::max(1, std::atoi(env)) : 5;
    // Each round runs the settings in a different order, with no speculation and auto always back
    // to back (in turn first): their ratio is the claim to check, and this machine's throughput
    // drifts by 10% over seconds.
    std::vector<std::vector<int32_t>> units;
    const bool paired = std::count(ks.begin(), ks.end(), 0) && std::count(ks.begin(), ks.end(), -1);
    for (int32_t k : ks) {
      if (paired && k == -1) continue;
      units.push_back(paired && k == 0 ? std::vector<int32_t>{0, -1} : std::vector<int32_t>{k});
    }
    for (int round = 0; round < rounds; ++round) {
      std::vector<int32_t> order;
      for (size_t i = 0; i < units.size(); ++i) {
        std::vector<int32_t> u = units[(i + round) % units.size()];
        if (round % 2) std::reverse(u.begin(), u.end());
        order.insert(order.end(), u.begin(), u.end());
      }
      for (int32_t k : order) {
        const GridRun r = RunGrid(m, synthetic, batch, k);
        tps[k].push_back(r.tokens_per_s);
        if (std::getenv("SPECULA_GRID_VERBOSE") != nullptr) {
          std::fprintf(stderr, "round %d k %d: %.0f tok/s (plain steps %.3f, mean k %.2f%s)\n", round, k, r.tokens_per_s,
                       r.spec_off, r.mean_k, r.cannot_pay ? ", drafts cannot pay" : "");
        }
        if (k < 0) last_auto = r;
      }
    }
    state.counters["auto_off_steps"] = last_auto.spec_off;
    state.counters["auto_mean_k"] = last_auto.mean_k;
    // Tokens/s: each setting's best round (interference from other tenants mostly slows a run).
    auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
    for (int32_t k : ks) state.counters[k < 0 ? "auto" : absl::StrCat("k", k)] = best(tps[k]);
    // Ratios: the median over rounds of each round's ratio, the runs of a round being adjacent in
    // time. Best-of ratios swung from 0.83 to 1.13 between identical runs of the real pair.
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    if (tps.count(-1) != 0) {
      // The best fixed k is the one of highest median throughput; each round's auto is compared with
      // that k's run of the round. (The best of the four fixed-k runs of each round, used before, is
      // biased upward by the noise: the largest of four noisy runs against one run of auto.)
      int32_t best_k = 0;
      for (int32_t k : ks) {
        if (k > 0 && (best_k == 0 || median(tps[k]) > median(tps[best_k]))) best_k = k;
      }
      std::vector<double> over_off, over_best;
      for (int r = 0; r < rounds; ++r) {
        if (tps.count(0) != 0) over_off.push_back(tps[-1][r] / tps[0][r]);
        if (best_k > 0) over_best.push_back(tps[-1][r] / tps[best_k][r]);
      }
      if (best_k > 0) state.counters["best_k"] = best_k;
      if (!over_off.empty()) state.counters["auto/off"] = median(over_off);
      if (!over_best.empty()) state.counters["auto/best_k"] = median(over_best);
    }
  }
}
BENCHMARK(BM_SpecGrid)
    ->ArgNames({"pair", "batch"})
    ->ArgsProduct({{0, 1}, {1, 8, 32}})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

// GPU decode benchmarks (built with the CUDA backend; needs a GPU).
//
// The model: the HF directory in $SPECULA_GPU_BENCH_MODEL (e.g. `specula make-model --shape
// llama-3-8b --dtype bf16 --out DIR`), by default a llama-3.2-1b-shape random model in bf16 written
// once to $TMPDIR/specula_bench. Run in bf16.
//
//  BM_GpuDecodeStep/batch:B/graphs:G
//                            one decode step (B sequences, one token each) at a context of 512
//                            tokens, replayed from a captured CUDA graph (G = 1) or launched op by
//                            op (G = 0). Counters: step_ms; floor_ms = weight bytes / device copy
//                            bandwidth measured here; ratio_to_floor.
//  BM_GpuGenerate/batch:B/graphs:G
//                            end to end through the engine: B requests of 32 prompt tokens and
//                            128 greedy output tokens; generated tokens/s (prefill included, as
//                            HF `generate` counts it; compare with bench/hf_generate_bench.py).
//  BM_GpuSpec/k:K/batch:B/host:H/draft:D
//                            speculation on the GPU: the synthetic proposer (each draft accepted
//                            with probability alpha = 0.8, NOT lossless) with a 2-layer draft on
//                            the GPU, of the target's width (D = 0) or of width 512 (D = 1), both
//                            with its vocabulary; K = 0 plain decoding, 1, 2 and 4 fixed, -1
//                            --num-spec-tokens auto. max(2 x B, 16) requests of 128 tokens, B at a
//                            time. Tokens are chosen on the device (H = 0), or on the host from
//                            copied logits (H = 1, for comparison).
//
//   build/release/bench/gpu_bench
//   SPECULA_GPU_BENCH_MODEL=/tmp/llama-3-8b build/release/bench/gpu_bench --benchmark_filter=DecodeStep
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "bench/bench_models.h"
#include "core/status_macros.h"
#include "draft/draft_model_proposer.h"
#include "engine/engine.h"
#include "kernels/make_backend.h"

namespace specula {
namespace {

struct Loaded {
  std::unique_ptr<LlamaModel> model;
  int64_t weight_bytes = 0;
  double copy_gbs = 0;
};

Loaded* Get(benchmark::State& state) {
  static Loaded* loaded = [] {
    auto* l = new Loaded;
    if (CudaDevices() == 0) return l;
    const char* env = std::getenv("SPECULA_GPU_BENCH_MODEL");
    const std::string dir =
        env != nullptr ? env : bench::RandomModel("llama-3.2-1b-bf16", *NamedShape("llama-3.2-1b"), DType::kBF16, 1);
    auto w = LoadModel(dir);
    if (!w.ok()) {
      std::fprintf(stderr, "%s\n", std::string(w.status().message()).c_str());
      return l;
    }
    const ModelConfig c = (*w)->config;
    auto be = MakeBackend({"cuda", "bf16"});
    if (!be.ok()) {
      std::fprintf(stderr, "%s\n", std::string(be.status().message()).c_str());
      return l;
    }
    auto m = LlamaModel::Create(std::move(w).value(), std::move(be).value());
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", std::string(m.status().message()).c_str());
      return l;
    }
    l->model = std::move(m).value();
    // Every weight is read once per step (the embedding only for B rows: not counted).
    const int64_t params = c.NumParams() - (c.tie_embeddings ? 0 : int64_t{c.vocab_size} * c.dim);
    l->weight_bytes = params * 2;
    auto bw = CudaCopyBandwidthGBs(0, size_t{1} << 30);
    l->copy_gbs = bw.ok() ? *bw : 0;
    return l;
  }();
  if (loaded->model == nullptr) state.SkipWithError("needs a GPU and a model (see the log above)");
  return loaded;
}

void BM_GpuDecodeStep(benchmark::State& state) {
  Loaded* l = Get(state);
  if (l->model == nullptr) return;
  LlamaModel& m = *l->model;
  const int32_t B = static_cast<int32_t>(state.range(0)), ctx = 512, bs = 16;
  m.set_max_graph_batch(state.range(1) != 0 ? 64 : 0);
  KvCache kv(m.config(), {bs, B * (ctx / bs + 1)}, &m.backend());
  if (!kv.status().ok()) return state.SkipWithError(std::string(kv.status().message()).c_str());
  std::vector<std::vector<BlockId>> tables(B);
  for (int32_t s = 0; s < B; ++s) {
    for (int32_t b = 0; b <= ctx / bs; ++b) tables[s].push_back(s * (ctx / bs + 1) + b);
  }
  std::vector<float> logits;
  std::vector<TokenId> one = {7};
  ForwardBatch batch;
  for (int32_t s = 0; s < B; ++s) batch.seqs.push_back({one, ctx - 1, tables[s]});
  // Warm-up captures the graph (the KV content is irrelevant to the cost).
  for (int i = 0; i < 3; ++i) {
    if (auto st = m.Forward(batch, kv, LogitsMode::kLastPerSequence, &logits); !st.ok()) {
      return state.SkipWithError(std::string(st.message()).c_str());
    }
  }
  for (auto _ : state) {
    auto st = m.Forward(batch, kv, LogitsMode::kLastPerSequence, &logits);
    if (!st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
  }
  const double floor_ms = l->copy_gbs > 0 ? l->weight_bytes / (l->copy_gbs * 1e9) * 1e3 : 0;
  state.counters["step_ms"] = benchmark::Counter(static_cast<double>(state.iterations()) / 1e3,
                                                 benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["floor_ms"] = floor_ms;
  // ratio_to_floor = step_ms / floor_ms, as an inverted rate: floor_ms * iterations / elapsed.
  state.counters["ratio_to_floor"] = benchmark::Counter(floor_ms > 0 ? static_cast<double>(state.iterations()) * floor_ms / 1e3 : 0,
                                                        benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["copy_GBs"] = l->copy_gbs;
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * B, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GpuDecodeStep)
    ->ArgNames({"batch", "graphs"})
    ->ArgsProduct({{1, 8, 32, 64}, {1, 0}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// n requests of 32 prompt tokens and 128 greedy output tokens (the HF comparison's workload).
absl::Status AddRequests(Engine& e, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    Request r;
    r.id = i;
    for (int t = 0; t < 32; ++t) r.prompt.push_back(1 + (i * 131 + t * 17) % 1000);
    r.max_tokens = 128;
    r.ignore_eos = true;
    RETURN_IF_ERROR(e.AddRequest(r));
  }
  return absl::OkStatus();
}

void BM_GpuGenerate(benchmark::State& state) {
  Loaded* l = Get(state);
  if (l->model == nullptr) return;
  LlamaModel& m = *l->model;
  const int32_t B = static_cast<int32_t>(state.range(0));
  m.set_max_graph_batch(state.range(1) != 0 ? 64 : 0);
  int64_t generated = 0;
  for (auto _ : state) {
    SchedulerConfig c;
    c.max_num_seqs = B;
    c.max_num_batched_tokens = 4096;
    c.num_blocks = B * 16 + 16;
    c.max_model_len = m.config().max_seq_len;
    Engine e(&m, nullptr, c);
    if (auto st = AddRequests(e, B); !st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
    while (e.HasUnfinished()) {
      for (auto& d : e.Step()) {
        if (d.finished && !d.final.error.empty()) return state.SkipWithError(d.final.error.c_str());
        generated += static_cast<int64_t>(d.tokens.size());
      }
    }
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(generated), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GpuGenerate)
    ->ArgNames({"batch", "graphs"})
    ->ArgsProduct({{1, 8, 32, 64}, {1, 0}})
    ->UseRealTime()
    ->Unit(benchmark::kSecond)
    ->Iterations(2);

// The drafts of BM_GpuSpec: 0, two layers of the target's width (31% of its bytes, most of them
// the 128k-row classifier); 1, two layers of width 512 with the same vocabulary (6%), as a small
// draft model sharing the target's tokenizer would be.
LlamaModel* SpecDraft(const ModelConfig& target, int32_t kind) {
  static std::unique_ptr<LlamaModel> drafts[2];
  if (drafts[kind] != nullptr) return drafts[kind].get();
  ModelConfig c = target;
  c.num_layers = 2;
  if (kind == 1) {
    c.dim = 512;
    c.hidden_dim = 1536;
    c.num_heads = 8;
    c.num_kv_heads = 8;
    c.head_dim = 64;
  }
  auto w = LoadModel(bench::RandomModel(kind == 0 ? "llama-3.2-1b-2layer-bf16" : "llama-3.2-1b-narrow-bf16", c,
                                        DType::kBF16, 2 + kind));
  auto be = MakeBackend({"cuda", "bf16"});
  if (!w.ok() || !be.ok()) return nullptr;
  auto d = LlamaModel::Create(std::move(w).value(), std::move(be).value());
  if (d.ok()) drafts[kind] = std::move(d).value();
  return drafts[kind].get();
}

void BM_GpuSpec(benchmark::State& state) {
  Loaded* l = Get(state);
  if (l->model == nullptr) return;
  LlamaModel& m = *l->model;
  m.set_max_graph_batch(64);
  LlamaModel* draft = SpecDraft(m.config(), static_cast<int32_t>(state.range(3)));
  if (draft == nullptr) return state.SkipWithError("cannot load the draft model");
  const int32_t k = static_cast<int32_t>(state.range(0)), B = static_cast<int32_t>(state.range(1));
  const bool host = state.range(2) != 0;
  // At batch 1, 16 requests in a row (2,048 tokens): with 2, auto's first steps (its acceptance
  // estimate starts at 0.5) were a third of the run.
  const int32_t requests = std::max(2 * B, 16);
  int64_t generated = 0;
  double drafts = 0, seq_steps = 0, cannot_pay = 0, lazy_measure = 0;
  for (auto _ : state) {
    state.PauseTiming();  // the engine's startup (auto's cost measurement) is not the step loop
    const int32_t blocks = B * 12 + 16;  // 32 prompt + 128 generated + 8 lookahead, blocks of 16
    DraftModelProposer proposer(draft, 16, blocks);
    SchedulerConfig c;
    c.max_num_seqs = B;
    c.max_num_batched_tokens = 4096;
    c.num_blocks = blocks;
    c.max_model_len = m.config().max_seq_len;
    c.num_spec_tokens = k < 0 ? 8 : k;
    SpecConfig spec;
    spec.proposer = k != 0 ? &proposer : nullptr;
    spec.synthetic_alpha = k != 0 ? 0.8 : -1.0;
    spec.allow_synthetic = true;
    spec.adaptive = k < 0;
    spec.verify_on = host ? SpecConfig::VerifyOn::kHost : SpecConfig::VerifyOn::kBackend;
    proposer.set_choose_on_backend(!host);
    Engine e(&m, nullptr, c, spec);
    if (auto st = e.Validate(); !st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
    if (auto st = AddRequests(e, requests); !st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
    const double startup_measure = e.stats().cost_measure_seconds;
    state.ResumeTiming();
    while (e.HasUnfinished()) {
      for (auto& d : e.Step()) {
        if (d.finished && !d.final.error.empty()) return state.SkipWithError(d.final.error.c_str());
      }
    }
    generated += e.stats().generated_tokens;
    cannot_pay += e.stats().drafts_cannot_pay ? 1 : 0;
    lazy_measure += e.stats().cost_measure_seconds - startup_measure;
    for (size_t j = 0; j < e.stats().spec_k_histogram.size(); ++j) {
      seq_steps += e.stats().spec_k_histogram[j];
      drafts += j * static_cast<double>(e.stats().spec_k_histogram[j]);
    }
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(generated), benchmark::Counter::kIsRate);
  state.counters["mean_k"] = drafts / std::max(seq_steps, 1.0);
  state.counters["cannot_pay"] = cannot_pay;  // runs where auto found that no draft could pay
  // Seconds that auto spent measuring larger shapes between steps (timed), over all iterations.
  state.counters["lazy_measure_s"] = lazy_measure;
}
void SpecArgs(benchmark::internal::Benchmark* b) {
  for (int draft : {0, 1}) {
    for (int batch : {1, 32, 64}) {
      for (int k : {0, 1, 2, 4, -1}) {
        if (k != 0 || draft == 0) b->Args({k, batch, 0, draft});
      }
    }
  }
  for (int batch : {1, 32}) {
    for (int k : {0, 4}) b->Args({k, batch, 1, 0});
  }
}
BENCHMARK(BM_GpuSpec)
    ->ArgNames({"k", "batch", "host", "draft"})
    ->Apply(SpecArgs)
    ->UseRealTime()
    ->Unit(benchmark::kSecond)
    ->Iterations(2);

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

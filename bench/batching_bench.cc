// Continuous-batching benchmarks on a stories15m-shape random model (context 1024):
//
//  BM_Throughput/max_num_seqs:N/kv_bf16:B
//                                256 requests, prompts of 64..512 tokens, 128 output tokens each,
//                                all queued at once, with an f32 (B=0) or bf16 (B=1) KV cache;
//                                reports generated tokens/s. Compare N=32 against N=1 (same run).
//  BM_Conversation/caching:B     a 20-turn conversation where each turn resends the whole history;
//                                reports prefill tokens computed with prefix caching on and off.
//
//   build/release/bench/batching_bench
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <random>

#include "bench/bench_models.h"
#include "engine/engine.h"
#include "model/make_model.h"
#include "kernels/cpu/cpu_backend.h"

namespace specula {
namespace {

LlamaModel& Model() {
  static LlamaModel* model = [] {
    ModelConfig c = *NamedShape("stories15m");
    c.max_seq_len = 1024;
    const std::string path = bench::RandomModel("stories15m-ctx1024", c, DType::kF32, 0);
    auto w = LoadModel(path);
    if (!w.ok()) std::abort();
    return new LlamaModel(std::move(w).value(), MakeCpuBackend());
  }();
  return *model;
}

SchedulerConfig Config(int32_t max_num_seqs, bool caching) {
  SchedulerConfig c;
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = 2048;
  c.block_size = 16;
  c.num_blocks = 32 * 1024 / 16 + 64;
  c.max_model_len = 1024;
  c.enable_prefix_caching = caching;
  return c;
}

void BM_Throughput(benchmark::State& state) {
  LlamaModel& model = Model();
  const int32_t vocab = model.config().vocab_size;
  if (!model.set_kv_dtype(state.range(1) ? DType::kBF16 : DType::kF32).ok()) return state.SkipWithError("kv dtype");
  for (auto _ : state) {
    Engine engine(&model, nullptr, Config(static_cast<int32_t>(state.range(0)), false));
    std::mt19937 rng(7);
    for (int i = 0; i < 256; ++i) {
      Request r;
      r.id = i;
      r.prompt.resize(64 + rng() % 449);  // 64..512 tokens
      for (TokenId& t : r.prompt) t = static_cast<TokenId>(rng() % (vocab - 2));
      r.max_tokens = 128;
      r.ignore_eos = true;
      if (!engine.AddRequest(r).ok()) state.SkipWithError("add");
    }
    const double t0 = engine.NowMs();
    while (engine.HasUnfinished()) engine.Step();
    const double seconds = (engine.NowMs() - t0) / 1000;
    state.counters["generated_tok/s"] = engine.stats().generated_tokens / seconds;
    state.counters["seconds"] = seconds;
    state.counters["steps"] = static_cast<double>(engine.stats().steps);
  }
}
BENCHMARK(BM_Throughput)
    ->ArgNames({"max_num_seqs", "kv_bf16"})
    ->ArgsProduct({{32, 1}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

void BM_Conversation(benchmark::State& state) {
  LlamaModel& model = Model();
  const bool caching = state.range(0) != 0;
  static std::map<bool, std::vector<TokenId>> transcripts;  // to check outputs are identical
  for (auto _ : state) {
    Engine engine(&model, nullptr, Config(4, caching));
    std::mt19937 rng(11);
    std::vector<TokenId> history = {model.config().bos_token_id >= 0 ? model.config().bos_token_id : 1};
    std::vector<TokenId> transcript;
    for (int turn = 0; turn < 20; ++turn) {
      for (int i = 0; i < 16; ++i) history.push_back(static_cast<TokenId>(rng() % 30000));  // user message
      Request r;
      r.id = turn;
      r.prompt = history;  // the whole conversation is resent every turn
      r.max_tokens = 24;
      r.ignore_eos = true;
      if (!engine.AddRequest(r).ok()) state.SkipWithError("add");
      std::vector<TokenId> answer;
      while (engine.HasUnfinished()) {
        for (auto& d : engine.Step()) answer.insert(answer.end(), d.tokens.begin(), d.tokens.end());
      }
      history.insert(history.end(), answer.begin(), answer.end());
      transcript.insert(transcript.end(), answer.begin(), answer.end());
    }
    state.counters["prefill_tokens"] = static_cast<double>(engine.stats().prefill_tokens);
    state.counters["prompt_tokens"] = static_cast<double>(engine.scheduler().blocks().query_tokens());
    transcripts[caching] = transcript;
  }
  if (transcripts.size() == 2) state.counters["outputs_identical"] = transcripts[true] == transcripts[false];
}
BENCHMARK(BM_Conversation)->ArgName("caching")->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

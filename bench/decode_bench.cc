// Single-sequence decode speed: the Specula engine against a plain C OpenMP forward pass (the
// llama2.c run.c approach) on the same weights, side by side in one run.
//
//   build/release/bench/decode_bench [--benchmark_filter=...]
//
// Models: stories260K.bin (real, models/ or $SPECULA_MODELS_DIR) and a random model of
// the stories15m shape written once to $TMPDIR/specula_bench/stories15m.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "bench/bench_models.h"
#include "bench/runc_reference.h"
#include "model/llama_model.h"
#include "model/make_model.h"
#include "kernels/cpu/cpu_backend.h"

namespace specula {
namespace {

constexpr int32_t kContext = 256;  // decode positions 0..255, then start over

std::string ModelPath(const std::string& name) {
  if (name == "stories260K") return bench::TinyStories("stories260K.bin");
  return bench::RandomModel(name, *NamedShape(name), DType::kF32, 0);
}

std::unique_ptr<ModelWeights> Load(const std::string& name) {
  auto w = LoadModel(ModelPath(name));
  if (!w.ok()) {
    std::fprintf(stderr, "cannot load %s: %s\n", name.c_str(), std::string(w.status().message()).c_str());
    std::exit(1);
  }
  return std::move(w).value();
}

// One decoder per implementation, each stepping one token at a time through positions 0..255.
class SpeculaDecoder {
 public:
  explicit SpeculaDecoder(const std::string& name) {
    auto weights = Load(name);
    config_ = weights->config;
    model_ = std::make_unique<LlamaModel>(std::move(weights), MakeCpuBackend());
    kv_ = std::make_unique<KvCache>(config_, KvCacheConfig{kBlock, kContext / kBlock});
    for (int32_t i = 0; i < kContext / kBlock; ++i) table_.push_back(i);
  }
  bool Step() {
    ForwardBatch batch;
    batch.seqs.push_back({absl::MakeConstSpan(&token_, 1), pos_, table_});
    if (!model_->Forward(batch, *kv_, LogitsMode::kLastPerSequence, &logits_).ok()) return false;
    token_ = static_cast<TokenId>(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
    pos_ = (pos_ + 1) % std::min(kContext, config_.max_seq_len);
    return true;
  }

 private:
  static constexpr int32_t kBlock = 16;
  ModelConfig config_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> kv_;
  std::vector<BlockId> table_;
  std::vector<float> logits_;  // [vocab]
  TokenId token_ = 1;
  int32_t pos_ = 0;
};

class RuncDecoder {
 public:
  explicit RuncDecoder(const std::string& name) : w_(Load(name)) {
    const ModelConfig& c = w_->config;
    for (const auto& l : w_->layers) {
      an_.push_back(l.attn_norm); wq_.push_back(l.wq.f32()); wk_.push_back(l.wk.f32()); wv_.push_back(l.wv.f32());
      wo_.push_back(l.wo.f32()); fn_.push_back(l.ffn_norm); wg_.push_back(l.w_gate.f32());
      wu_.push_back(l.w_up.f32()); wd_.push_back(l.w_down.f32());
    }
    rw_ = RuncWeights{c.dim, c.hidden_dim, c.num_layers, c.num_heads, c.num_kv_heads, c.vocab_size,
                      std::min(kContext, c.max_seq_len), c.rope_interleaved, c.rope_theta, c.norm_eps,
                      w_->embed.f32(), an_.data(), wq_.data(), wk_.data(), wv_.data(), wo_.data(), fn_.data(),
                      wg_.data(), wu_.data(), wd_.data(), w_->final_norm, w_->lm_head.f32()};
    runc_alloc(&rw_, &s_);
  }
  ~RuncDecoder() { runc_free(&s_); }
  bool Step() {
    const float* logits = runc_forward(&rw_, &s_, token_, pos_);
    token_ = static_cast<int>(std::max_element(logits, logits + rw_.vocab_size) - logits);
    pos_ = (pos_ + 1) % rw_.seq_len;
    return true;
  }

 private:
  std::unique_ptr<ModelWeights> w_;
  std::vector<const float*> an_, wq_, wk_, wv_, wo_, fn_, wg_, wu_, wd_;
  RuncWeights rw_;
  RuncState s_;
  int token_ = 1, pos_ = 0;
};

template <typename Decoder>
void BM_Decode(benchmark::State& state, const std::string& name) {
  Decoder d(name);
  for (auto _ : state) {
    if (!d.Step()) state.SkipWithError("forward failed");
  }
  state.counters["tokens/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}

// Side by side: each iteration decodes 16 tokens with Specula, then 16 with the run.c-style
// baseline, timing each half, so both see the same machine conditions. Reports both rates and
// speedup = Specula tokens/s over baseline tokens/s.
void BM_SideBySide(benchmark::State& state, const std::string& name) {
  SpeculaDecoder a(name);
  RuncDecoder b(name);
  using Clock = std::chrono::steady_clock;
  double ta = 0, tb = 0;
  int64_t n = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    for (int i = 0; i < 16; ++i) a.Step();
    auto t1 = Clock::now();
    for (int i = 0; i < 16; ++i) b.Step();
    auto t2 = Clock::now();
    ta += std::chrono::duration<double>(t1 - t0).count();
    tb += std::chrono::duration<double>(t2 - t1).count();
    n += 16;
  }
  state.counters["specula_tok/s"] = n / ta;
  state.counters["runc_tok/s"] = n / tb;
  state.counters["speedup"] = tb / ta;
}

BENCHMARK_CAPTURE(BM_SideBySide, stories260K, std::string("stories260K"))->MinTime(3.0)->UseRealTime();
BENCHMARK_CAPTURE(BM_SideBySide, stories15m, std::string("stories15m"))->MinTime(6.0)->UseRealTime();
void BM_SpeculaDecode(benchmark::State& s, const std::string& n) { BM_Decode<SpeculaDecoder>(s, n); }
void BM_RuncDecode(benchmark::State& s, const std::string& n) { BM_Decode<RuncDecoder>(s, n); }
BENCHMARK_CAPTURE(BM_SpeculaDecode, stories260K, std::string("stories260K"))->MinTime(1.0)->UseRealTime();
BENCHMARK_CAPTURE(BM_RuncDecode, stories260K, std::string("stories260K"))->MinTime(1.0)->UseRealTime();
BENCHMARK_CAPTURE(BM_SpeculaDecode, stories15m, std::string("stories15m"))->MinTime(2.0)->UseRealTime();
BENCHMARK_CAPTURE(BM_RuncDecode, stories15m, std::string("stories15m"))->MinTime(2.0)->UseRealTime();

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();

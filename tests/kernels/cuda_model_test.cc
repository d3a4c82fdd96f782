// End to end on the GPU (label `gpu`, skipped without one): greedy tokens equal the CPU
// reference's on stories260K and on random HF models (f32 and bf16; where bf16 first diverges is
// printed), batched decoding through captured graphs equals the CPU engine, and speculative
// decoding on the GPU equals plain greedy decoding on the GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "draft/draft_model_proposer.h"
#include "draft/ngram_proposer.h"
#include "engine/engine.h"
#include "tests/one_sequence.h"
#include "model/make_model.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/gpu_util.h"
#include "tests/test_util.h"
#include "tests/tiny_pair.h"

namespace specula {
namespace {

std::unique_ptr<LlamaModel> Load(const std::string& path, const std::string& device, const std::string& dtype) {
  auto w = LoadModel(path);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  auto be = MakeBackend({device, dtype});
  EXPECT_TRUE(be.ok()) << be.status();
  if (!be.ok()) return nullptr;
  auto m = LlamaModel::Create(std::move(w).value(), std::move(be).value());
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<TokenId> Greedy(LlamaModel& m, const std::vector<TokenId>& prompt, int32_t n) {
  GenerateOptions opt;
  opt.max_tokens = n;
  auto r = Generate(m, prompt, opt);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->tokens : std::vector<TokenId>{};
}

int32_t FirstDifference(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int32_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int32_t>(n);
}

// Generates 64 tokens on both backends and requires the first 32 to match.
void ExpectGreedyMatchesCpu(const std::string& path, const std::vector<TokenId>& prompt, const std::string& dtype) {
  auto cpu = Load(path, "cpu", "");
  auto gpu = Load(path, "cuda", dtype);
  ASSERT_TRUE(cpu && gpu);
  const auto want = Greedy(*cpu, prompt, 64), got = Greedy(*gpu, prompt, 64);
  const int32_t diff = FirstDifference(want, got);
  std::printf("[gpu] %s %s: %s\n", path.c_str(), dtype.c_str(),
              diff < 0 ? "all 64 greedy tokens equal the CPU's" : absl::StrCat("first differs at token ", diff).c_str());
  ASSERT_GE(want.size(), 32u);
  EXPECT_TRUE(diff < 0 || diff >= 32) << path << " " << dtype << ": GPU greedy tokens differ from CPU at " << diff;
}

// Teacher-forced logits of `tokens` (one prefill, every row) on the CPU and on the GPU in `dtype`.
// Requires ||gpu - cpu|| / ||cpu|| <= max_rel, and at every position the CPU's greedy token to be
// the GPU's too, unless the CPU's two best logits are closer than twice that row's largest
// error: an error of e per logit can only swap tokens whose logits are within 2e.
void ExpectLogitsMatchCpu(const std::string& path, const std::vector<TokenId>& tokens, const std::string& dtype,
                          double max_rel) {
  auto cpu = Load(path, "cpu", "");
  auto gpu = Load(path, "cuda", dtype);
  ASSERT_TRUE(cpu && gpu);
  const int32_t n = static_cast<int32_t>(tokens.size()), bs = 16, V = cpu->config().vocab_size;
  std::vector<BlockId> table;
  for (int32_t b = 0; b * bs < n; ++b) table.push_back(b);
  auto run = [&](LlamaModel& m) {
    KvCache kv(m.config(), {bs, static_cast<int32_t>(table.size())}, &m.backend());
    EXPECT_TRUE(kv.status().ok()) << kv.status();
    ForwardBatch batch;
    batch.seqs.push_back({tokens, 0, table});
    std::vector<float> logits;
    const absl::Status st = m.Forward(batch, kv, LogitsMode::kAll, &logits);
    EXPECT_TRUE(st.ok()) << st;
    return logits;
  };
  const std::vector<float> want = run(*cpu), got = run(*gpu);
  ASSERT_EQ(want.size(), static_cast<size_t>(n) * V);
  ASSERT_EQ(got.size(), want.size());
  double err = 0, ref = 0;
  int32_t swapped = 0, near_ties = 0;
  for (int32_t r = 0; r < n; ++r) {
    const float* w = want.data() + static_cast<size_t>(r) * V;
    const float* g = got.data() + static_cast<size_t>(r) * V;
    float row_err = 0;
    for (int32_t j = 0; j < V; ++j) {
      ASSERT_TRUE(std::isfinite(g[j])) << "row " << r << " logit " << j;
      err += double(g[j] - w[j]) * (g[j] - w[j]);
      ref += double(w[j]) * w[j];
      row_err = std::max(row_err, std::abs(g[j] - w[j]));
    }
    const int32_t best_w = static_cast<int32_t>(std::max_element(w, w + V) - w);
    const int32_t best_g = static_cast<int32_t>(std::max_element(g, g + V) - g);
    float second = -INFINITY;
    for (int32_t j = 0; j < V; ++j) {
      if (j != best_w) second = std::max(second, w[j]);
    }
    const bool near_tie = w[best_w] - second < 2 * row_err;
    near_ties += near_tie;
    if (best_w != best_g) {
      ++swapped;
      EXPECT_TRUE(near_tie) << path << " " << dtype << " row " << r << ": GPU picks " << best_g << ", CPU " << best_w
                            << " with a margin of " << w[best_w] - second << " over an error of " << row_err;
    }
  }
  const double rel = std::sqrt(err / ref);
  std::printf("[gpu] %s %s: %d positions, logits rel err %.2e, greedy token differs at %d (near ties: %d)\n",
              path.c_str(), dtype.c_str(), n, rel, swapped, near_ties);
  EXPECT_LE(rel, max_rel) << path << " " << dtype;
}

TEST(CudaModelTest, Stories260kGreedyEqualsCpu) {
  SPECULA_REQUIRE_GPU();
  const std::string dir = testing::TinyStoriesDir();
  auto tok = LoadTokenizer(dir + "/tok512.bin", 512);
  ASSERT_TRUE(tok.ok());
  for (const char* text : {"Once upon a time", "Lily and Tom went to the park", "The dog"}) {
    const auto prompt = (*tok)->Encode(text, true);
    for (const char* dtype : {"f32", "bf16", "f16"}) ExpectGreedyMatchesCpu(dir + "/stories260K.bin", prompt, dtype);
  }
}

TEST(CudaModelTest, RandomHfModelsGreedyEqualCpu) {
  SPECULA_REQUIRE_GPU();
  struct Shape {
    int32_t heads, kv_heads;
    bool qkv_bias, tied, llama3;
  };
  for (const Shape& s : {Shape{8, 2, true, false, false}, Shape{4, 1, false, true, true}, Shape{6, 6, false, false, false}}) {
    ModelConfig c;
    c.dim = 192;
    c.hidden_dim = 320;
    c.num_layers = 3;
    c.num_heads = s.heads;
    c.num_kv_heads = s.kv_heads;
    c.head_dim = c.dim / c.num_heads;
    c.vocab_size = 301;
    c.max_seq_len = 256;
    c.qkv_bias = s.qkv_bias;
    c.tie_embeddings = s.tied;
    if (s.llama3) c.rope_scaling = {"llama3", 8.0f, 1.0f, 4.0f, 64};
    const std::string dir = testing::MakeTempDir();
    ASSERT_TRUE(WriteRandomModel(c, dir, DType::kF32, 11).ok());
    const std::vector<TokenId> prompt = {1, 17, 42, 99, 7, 250, 3};
    // f32 computes what the CPU does: 64 equal greedy tokens. bf16 rounds every activation, and a
    // random model's logits have near ties: its logits are checked along the CPU's tokens.
    ExpectGreedyMatchesCpu(dir, prompt, "f32");
    auto cpu = Load(dir, "cpu", "");
    ASSERT_TRUE(cpu);
    std::vector<TokenId> tokens = prompt;
    const auto gen = Greedy(*cpu, prompt, 64);
    tokens.insert(tokens.end(), gen.begin(), gen.end());
    ExpectLogitsMatchCpu(dir, tokens, "f32", 1e-4);
    ExpectLogitsMatchCpu(dir, tokens, "bf16", 3e-2);
  }
}

// Captured decode graphs bake in the KV pool's device pointers. A new pool that takes a freed
// pool's place (the same KvCache address, as when an engine is rebuilt) must not replay them: the
// decode after a prefill into the new pool must read the new pool.
TEST(CudaModelTest, GraphsFollowANewPoolInAFreedPoolsPlace) {
  SPECULA_REQUIRE_GPU();
  const std::string path = testing::TinyStoriesDir() + "/stories260K.bin";
  auto cpu = Load(path, "cpu", ""), gpu = Load(path, "cuda", "f32");
  ASSERT_TRUE(cpu && gpu);
  const std::vector<TokenId> prompt = {1, 403, 261, 378, 219, 9};
  auto prefill_then_decode = [&](LlamaModel& m, KvCache& kv, TokenId next) {
    const std::vector<BlockId> table = {3, 1};
    std::vector<float> logits;
    ForwardBatch prefill;
    prefill.seqs.push_back({prompt, 0, table});
    EXPECT_TRUE(m.Forward(prefill, kv, LogitsMode::kLastPerSequence, &logits).ok());
    const std::vector<TokenId> one = {next};
    ForwardBatch decode;  // one token per sequence: a graph on the GPU
    decode.seqs.push_back({one, static_cast<int32_t>(prompt.size()), table});
    const absl::Status st = m.Forward(decode, kv, LogitsMode::kLastPerSequence, &logits);
    EXPECT_TRUE(st.ok()) << st;
    return logits;
  };
  KvCache cpu_kv(cpu->config(), {16, 4}, &cpu->backend());
  std::optional<KvCache> kv;
  for (int32_t round = 0; round < 3; ++round) {
    kv.reset();
    kv.emplace(gpu->config(), KvCacheConfig{16, 4 + 8 * round}, &gpu->backend());  // same address, new memory
    ASSERT_TRUE(kv->status().ok()) << kv->status();
    const TokenId next = 20 + 37 * round;
    const auto want = prefill_then_decode(*cpu, cpu_kv, next), got = prefill_then_decode(*gpu, *kv, next);
    ASSERT_EQ(got.size(), want.size());
    double err = 0, ref = 0;
    for (size_t j = 0; j < want.size(); ++j) {
      err += double(got[j] - want[j]) * (got[j] - want[j]);
      ref += double(want[j]) * want[j];
    }
    EXPECT_LE(std::sqrt(err / ref), 1e-4) << "round " << round;
  }
}

std::vector<Request> Requests(int n) {
  std::vector<Request> reqs;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.id = i;
    r.prompt = {1, static_cast<TokenId>(10 + i * 7 % 400), static_cast<TokenId>(300 + i % 50), 42};
    r.max_tokens = 24 + i % 13;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  return reqs;
}

// k < 0: --num-spec-tokens auto with at most 8 drafts.
std::map<RequestId, std::vector<TokenId>> RunEngine(LlamaModel& m, const std::vector<Request>& reqs, int32_t max_seqs,
                                                    Proposer* proposer, int32_t k,
                                                    SpecConfig::VerifyOn verify_on = SpecConfig::VerifyOn::kAuto) {
  SchedulerConfig c;
  c.max_num_seqs = max_seqs;
  c.max_num_batched_tokens = 1024;
  c.block_size = 16;
  c.num_blocks = 512;
  c.max_model_len = m.config().max_seq_len;
  c.num_spec_tokens = k < 0 ? 8 : k;
  SpecConfig spec;
  spec.proposer = proposer;
  spec.adaptive = k < 0;
  spec.calibration_seconds = 0.2;
  spec.verify_on = verify_on;
  Engine e(&m, nullptr, c, spec);
  EXPECT_TRUE(e.Validate().ok()) << e.Validate();
  for (const Request& r : reqs) EXPECT_TRUE(e.AddRequest(r).ok());
  std::map<RequestId, std::vector<TokenId>> out;
  while (e.HasUnfinished()) {
    for (auto& d : e.Step()) {
      if (!d.finished) continue;
      EXPECT_TRUE(d.final.error.empty()) << d.final.error;
      out[d.id] = d.final.tokens;
    }
  }
  return out;
}

// Decode steps of 1..32 sequences replay captured graphs (padded batches); prefill does not.
TEST(CudaModelTest, BatchedEngineWithGraphsEqualsCpu) {
  SPECULA_REQUIRE_GPU();
  const std::string path = testing::TinyStoriesDir() + "/stories260K.bin";
  auto cpu = Load(path, "cpu", ""), gpu = Load(path, "cuda", "f32");
  ASSERT_TRUE(cpu && gpu);
  const auto reqs = Requests(27);
  const auto want = RunEngine(*cpu, reqs, 32, nullptr, 0), got = RunEngine(*gpu, reqs, 32, nullptr, 0);
  ASSERT_EQ(want.size(), reqs.size());
  for (const auto& [id, tokens] : want) EXPECT_EQ(got.at(id), tokens) << "request " << id;
}

// Speculative greedy output on the GPU (draft model and n-gram; k = 1, 4 and auto; batched, tokens
// chosen on the device and steps replayed from graphs) equals plain greedy output on the GPU. f32
// must match exactly; bf16 (where a verification GEMM of k+1 rows may round differently from a
// decode GEMM) must match on at least 90% of requests, and the rate is printed.
TEST(CudaModelTest, SpeculativeGreedyEqualsPlainOnGpu) {
  SPECULA_REQUIRE_GPU();
  const std::string dir = testing::TinyStoriesDir();
  const auto reqs = Requests(32);
  for (const char* dtype : {"f32", "bf16"}) {
    auto target = Load(dir + "/stories260K.bin", "cuda", dtype), draft = Load(dir + "/stories260K-draft.bin", "cuda", dtype);
    ASSERT_TRUE(target && draft);
    const auto plain = RunEngine(*target, reqs, 32, nullptr, 0);
    for (int32_t k : {1, 4, -1}) {
      DraftModelProposer proposer(draft.get(), 16, 512);
      NgramProposer ngram(1, 3);
      for (Proposer* p : {static_cast<Proposer*>(&proposer), static_cast<Proposer*>(&ngram)}) {
        const char* name = p == &proposer ? "draft" : "ngram";
        const auto spec = RunEngine(*target, reqs, 32, p, k);
        int same = 0;
        for (const auto& [id, tokens] : plain) same += spec.at(id) == tokens;
        std::printf("[gpu] speculative %s %s k=%d: %d of %zu requests identical to plain greedy\n", name, dtype, k,
                    same, reqs.size());
        if (std::string(dtype) == "f32") {
          EXPECT_EQ(same, static_cast<int>(reqs.size())) << name << " " << dtype << " k=" << k;
        } else {
          EXPECT_GE(same * 10, static_cast<int>(reqs.size()) * 9) << name << " " << dtype << " k=" << k;
        }
      }
      EXPECT_EQ(proposer.blocks_in_use(), 0);
    }
  }
}

// The same engine choosing its tokens on the host, from copied logits (the CPU reference's way),
// and on the device: the same greedy tokens, speculative or not.
TEST(CudaModelTest, DeviceVerificationEqualsHostVerification) {
  SPECULA_REQUIRE_GPU();
  const std::string dir = testing::TinyStoriesDir();
  const auto reqs = Requests(24);
  auto target = Load(dir + "/stories260K.bin", "cuda", "f32"), draft = Load(dir + "/stories260K-draft.bin", "cuda", "f32");
  ASSERT_TRUE(target && draft);
  for (int32_t k : {0, 4}) {
    DraftModelProposer on_host(draft.get(), 16, 512), on_device(draft.get(), 16, 512);
    on_host.set_choose_on_backend(false);
    const auto host = RunEngine(*target, reqs, 32, k > 0 ? &on_host : nullptr, k, SpecConfig::VerifyOn::kHost);
    const auto device = RunEngine(*target, reqs, 32, k > 0 ? &on_device : nullptr, k, SpecConfig::VerifyOn::kBackend);
    ASSERT_EQ(host.size(), reqs.size());
    for (const auto& [id, tokens] : host) EXPECT_EQ(device.at(id), tokens) << "k=" << k << " request " << id;
  }
}

// The first two generated tokens of `n` requests of `prompt` at temperature 1 on `target`, with
// speculation (a draft model proposing k = 2) and every choice on the device: the draft's samples
// and distributions, rejection sampling. Counts by (t1, t2), [vocab * vocab].
std::vector<double> SampledPairs(LlamaModel& target, LlamaModel& draft, const std::vector<TokenId>& prompt, int64_t n,
                                 double synthetic_alpha) {
  const int32_t V = target.config().vocab_size;
  DraftModelProposer proposer(&draft, 16, 4096);
  SchedulerConfig c;
  c.max_num_seqs = 256;
  c.max_num_batched_tokens = 4096;
  c.block_size = 16;
  c.num_blocks = 4096;
  c.max_model_len = target.config().max_seq_len;
  c.num_spec_tokens = 2;
  SpecConfig spec{&proposer};
  spec.synthetic_alpha = synthetic_alpha;
  spec.allow_synthetic = true;
  spec.verify_on = SpecConfig::VerifyOn::kBackend;
  Engine e(&target, nullptr, c, spec);
  EXPECT_TRUE(e.Validate().ok()) << e.Validate();
  std::vector<double> counts(static_cast<size_t>(V) * V, 0.0);
  for (int64_t i = 0; i < n;) {
    for (int j = 0; j < 256 && i < n; ++j, ++i) {
      Request r;
      r.id = i;
      r.prompt = prompt;
      r.max_tokens = 4;
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 1000003 * i + 17;
      r.ignore_eos = true;
      EXPECT_TRUE(e.AddRequest(r).ok());
    }
    while (e.HasUnfinished()) {
      for (auto& d : e.Step()) {
        if (d.finished && d.final.tokens.size() >= 2) counts[d.final.tokens[0] * V + d.final.tokens[1]] += 1;
      }
    }
  }
  EXPECT_GT(e.stats().spec.accepted_tokens, 0);
  return counts;
}

// Sampled speculation with every choice on the GPU follows the target's distribution: the joint of
// the first two tokens against the exact one from the CPU backend (chi-square, p > 0.001), and a
// verifier that accepts every draft is caught (p < 0.001).
TEST(CudaModelTest, SampledSpeculationOnTheDeviceFollowsTheTarget) {
  SPECULA_REQUIRE_GPU();
  const auto [td, dd] = testing::WriteTinyPair();
  auto cpu = Load(td, "cpu", ""), target = Load(td, "cuda", "f32"), draft = Load(dd, "cuda", "f32");
  ASSERT_TRUE(cpu && target && draft);
  const int32_t V = cpu->config().vocab_size;
  const std::vector<TokenId> prompt = {3, 7, 1};
  SamplingParams sp;
  sp.temperature = 1.0f;
  auto next = [&](const std::vector<TokenId>& tokens) {  // the CPU target's distribution after `tokens`
    KvCache kv(cpu->config(), {16, 1}, &cpu->backend());
    ForwardBatch batch;
    const std::vector<BlockId> table = {0};
    batch.seqs.push_back({tokens, 0, table});
    std::vector<float> logits, p;
    EXPECT_TRUE(cpu->Forward(batch, kv, LogitsMode::kLastPerSequence, &logits).ok());
    SamplingProbabilities(sp, logits, {}, &p);
    return p;
  };
  std::vector<double> exact(static_cast<size_t>(V) * V);
  const std::vector<float> p1 = next(prompt);
  for (int32_t a = 0; a < V; ++a) {
    std::vector<TokenId> t = prompt;
    t.push_back(a);
    const std::vector<float> p2 = next(t);
    for (int32_t b = 0; b < V; ++b) exact[a * V + b] = double(p1[a]) * p2[b];
  }
  // Chi-square over the cells expected 5 or more times (the rest pooled), its p-value by the
  // Wilson-Hilferty approximation.
  const int64_t n = 20000;
  auto p_value = [&](const std::vector<double>& counts) {
    double stat = 0, pooled_obs = 0, pooled_exp = 0;
    int dof = -1;
    for (size_t c = 0; c < counts.size(); ++c) {
      const double e = n * exact[c];
      if (e < 5) {
        pooled_obs += counts[c];
        pooled_exp += e;
        continue;
      }
      stat += (counts[c] - e) * (counts[c] - e) / e;
      ++dof;
    }
    if (pooled_exp > 0) {
      stat += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
      ++dof;
    }
    const double z = (std::cbrt(stat / dof) - (1 - 2.0 / (9 * dof))) / std::sqrt(2.0 / (9 * dof));
    return std::make_pair(0.5 * std::erfc(z / std::sqrt(2.0)), dof);
  };
  const auto [ok, dof] = p_value(SampledPairs(*target, *draft, prompt, n, -1));
  const auto [broken, bdof] = p_value(SampledPairs(*target, *draft, prompt, n, 1.0));
  std::printf("[gpu] sampled speculation on the device, 2 tokens, k=2: p = %.4f (dof %d); always-accept "
              "verifier: p = %.3g\n", ok, dof, broken);
  EXPECT_GT(ok, 0.001);
  EXPECT_LT(broken, 0.001);
}

}  // namespace
}  // namespace specula

// End to end on the real stories260K model: continuous batching (with chunked prefill, preemption
// and prefix caching) gives exactly the tokens each prompt gives alone.
#include "engine/engine.h"

#include <omp.h>

#include <chrono>
#include <map>

#include "tests/one_sequence.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/test_util.h"

namespace specula {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::TinyStoriesDir();
    auto w = LoadModel(dir + "/stories260K.bin");
    ASSERT_TRUE(w.ok()) << w.status();
    auto tok = LoadTokenizer(dir + "/tok512.bin", 512);
    ASSERT_TRUE(tok.ok());
    tok_ = std::move(tok).value();
    model_ = std::make_unique<LlamaModel>(std::move(w).value(), MakeCpuBackend());
  }

  // 64 different prompts of 2 to ~40 tokens, optionally behind a shared prefix.
  std::vector<Request> Requests(const std::string& prefix = "") {
    const std::vector<std::string> who = {"Lily", "Tom", "The little dog", "A big bird", "Sue and Ben", "The old man",
                                          "A tiny fish", "Mom"};
    const std::vector<std::string> what = {"went to the park", "found a red ball", "was sad", "saw a cat",
                                           "wanted to fly", "ate a cake", "lost a toy", "had a dream"};
    std::vector<Request> out;
    for (int i = 0; i < 64; ++i) {
      Request r;
      r.id = i;
      std::string text = prefix + who[i % 8];
      if (i % 3 != 0) text += " " + what[(i / 8 + i) % 8];
      if (i % 5 == 0) text += " and then " + what[i % 8] + " with " + who[(i + 3) % 8];
      r.prompt = tok_->Encode(text, true);
      r.max_tokens = 8 + (i * 7) % 40;
      r.ignore_eos = true;
      out.push_back(std::move(r));
    }
    return out;
  }

  std::vector<TokenId> Alone(const Request& r) {
    GenerateOptions opt;
    opt.max_tokens = r.max_tokens;
    opt.sampling = r.sampling;
    auto g = Generate(*model_, r.prompt, opt);
    EXPECT_TRUE(g.ok());
    return g->tokens;
  }

  std::map<RequestId, RequestOutput> RunAll(Engine& e, const std::vector<Request>& reqs) {
    for (const Request& r : reqs) EXPECT_TRUE(e.AddRequest(r).ok());
    std::map<RequestId, RequestOutput> out;
    for (int steps = 0; e.HasUnfinished(); ++steps) {
      EXPECT_LT(steps, 100000);
      for (RequestDelta& d : e.Step()) {
        if (d.finished) out.emplace(d.id, std::move(d.final));
      }
    }
    EXPECT_TRUE(e.scheduler().CheckInvariants().ok());
    EXPECT_EQ(e.scheduler().blocks().num_available(), e.scheduler().blocks().num_blocks());
    return out;
  }

  SchedulerConfig Config(int32_t num_blocks, bool caching) {
    SchedulerConfig c;
    c.max_num_seqs = 64;
    c.max_num_batched_tokens = 256;
    c.block_size = 16;
    c.num_blocks = num_blocks;
    c.max_model_len = model_->config().max_seq_len;
    c.enable_prefix_caching = caching;
    return c;
  }

  void ExpectSameAsAlone(const std::vector<Request>& reqs, std::map<RequestId, RequestOutput>& got) {
    ASSERT_EQ(got.size(), reqs.size());
    for (const Request& r : reqs) {
      EXPECT_EQ(got[r.id].finish, FinishReason::kMaxTokens);
      EXPECT_EQ(got[r.id].tokens, Alone(r)) << "request " << r.id;
    }
  }

  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_F(EngineTest, SixtyFourPromptsBatchedEqualEachAlone) {
  const auto reqs = Requests();
  Engine e(model_.get(), tok_.get(), Config(512, false));
  auto got = RunAll(e, reqs);
  ExpectSameAsAlone(reqs, got);
  EXPECT_EQ(e.scheduler().num_preemptions(), 0);
  std::printf("[engine] 64 prompts in %lld steps\n", static_cast<long long>(e.stats().steps));
}

TEST_F(EngineTest, SmallPoolPreemptsAndStillEqualsAlone) {
  const auto reqs = Requests();
  Engine e(model_.get(), tok_.get(), Config(24, false));  // 24 blocks of 16 for 64 sequences
  auto got = RunAll(e, reqs);
  EXPECT_GT(e.scheduler().num_preemptions(), 0);
  ExpectSameAsAlone(reqs, got);
  std::printf("[engine] small pool: %lld preemptions\n", static_cast<long long>(e.scheduler().num_preemptions()));
}

// A step samples its rows without drafts on every core (from 8 rows): each sequence draws from its
// own seeded stream and penalizes its own history, so sampled tokens are still those of each prompt
// alone. The test presets give tests one OpenMP thread; this one asks for two.
TEST_F(EngineTest, SampledPromptsOnTwoThreadsEqualEachAlone) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  auto reqs = Requests();
  for (Request& r : reqs) {
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.repetition_penalty = 1.1f;
    r.sampling.seed = 1000 + r.id;
  }
  Engine e(model_.get(), tok_.get(), Config(512, false));
  auto got = RunAll(e, reqs);
  omp_set_num_threads(threads);
  ExpectSameAsAlone(reqs, got);
}

// A bf16 KV cache (the engine's, and Generate's for the single runs) keeps batching exact: the same
// tokens alone and batched, with preemption and recomputation.
TEST_F(EngineTest, Bf16KvCacheBatchedEqualsEachAlone) {
  ASSERT_TRUE(model_->set_kv_dtype(DType::kBF16).ok());
  const auto reqs = Requests();
  Engine e(model_.get(), tok_.get(), Config(24, false));
  auto got = RunAll(e, reqs);
  EXPECT_GT(e.scheduler().num_preemptions(), 0);
  ExpectSameAsAlone(reqs, got);
  EXPECT_FALSE(model_->set_kv_dtype(DType::kF16).ok());  // not a CPU KV type
}

TEST_F(EngineTest, SharedPrefixHitsTheCacheWithUnchangedOutputs) {
  const std::string prefix =
      "Once upon a time, there was a kind girl who loved stories. Every night her mom told her a story. ";
  const auto reqs = Requests(prefix);
  Engine e(model_.get(), tok_.get(), Config(512, true));
  auto got = RunAll(e, reqs);
  ExpectSameAsAlone(reqs, got);
  const BlockManager& bm = e.scheduler().blocks();
  const double hit_rate = static_cast<double>(bm.hit_tokens()) / bm.query_tokens();
  int64_t cached = 0;
  for (auto& [id, o] : got) cached += o.cached_prompt_tokens;
  EXPECT_GT(hit_rate, 0.0);
  EXPECT_GT(cached, 0);
  std::printf("[engine] shared prefix: prefix-cache hit rate %.1f%% (%lld of %lld prompt tokens)\n", 100 * hit_rate,
              static_cast<long long>(bm.hit_tokens()), static_cast<long long>(bm.query_tokens()));
}

TEST_F(EngineTest, AbortStopStringsAndBadRequests) {
  Engine e(model_.get(), tok_.get(), Config(64, true));
  Request a;
  a.id = 1;
  a.prompt = tok_->Encode("Once upon a time", true);
  a.max_tokens = 100;
  a.stop_strings = {"Lily"};
  Request b = a;
  b.id = 2;
  b.stop_strings.clear();
  Request bad = a;
  bad.id = 3;
  bad.prompt = {1, 5000};
  EXPECT_NE(e.AddRequest(bad).message().find("token id 5000"), std::string::npos);
  bad.prompt = a.prompt;
  bad.sampling.top_p = 0;
  EXPECT_FALSE(e.AddRequest(bad).ok());
  ASSERT_TRUE(e.AddRequest(a).ok());
  ASSERT_TRUE(e.AddRequest(b).ok());
  EXPECT_EQ(e.AddRequest(a).code(), absl::StatusCode::kAlreadyExists);
  std::map<RequestId, RequestOutput> out;
  auto step = [&] {
    for (auto& d : e.Step()) {
      if (d.finished) out.emplace(d.id, std::move(d.final));
    }
  };
  for (int i = 0; i < 3; ++i) step();
  e.Abort(2);
  while (e.HasUnfinished()) step();
  step();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].finish, FinishReason::kStopString);
  EXPECT_EQ(out[1].text, ", there was a little girl named ");
  EXPECT_EQ(out[2].finish, FinishReason::kAborted);
  EXPECT_GT(out[1].first_token_ms, out[1].arrival_ms);
  EXPECT_EQ(out[1].token_ms.size(), out[1].tokens.size());
  EXPECT_EQ(e.scheduler().blocks().num_available(), 64);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// The engine runs on an injected clock: request times are that clock's, and the batching window's
// wait advances it instead of sleeping (what the serving simulator relies on).
TEST_F(EngineTest, RunsOnAnInjectedClock) {
  ManualClock clock(100.0);
  SchedulerConfig c = Config(64, false);
  c.max_wait_ms = 50;  // a lone arrival waits up to 50 ms of the clock for company
  Engine e(model_.get(), tok_.get(), c, {}, &clock);
  EXPECT_EQ(e.NowMs(), 0.0);
  clock.Advance(0.25);
  std::vector<Request> reqs = Requests();
  reqs.resize(1);
  ASSERT_TRUE(e.AddRequest(reqs[0]).ok());
  const auto wall = std::chrono::steady_clock::now();
  RequestOutput out;
  for (int steps = 0; e.HasUnfinished() && steps < 1000; ++steps) {
    for (RequestDelta& d : e.Step()) {
      if (d.finished) out = std::move(d.final);
    }
    clock.Advance(0.010);  // each step "takes" 10 ms
  }
  EXPECT_EQ(out.arrival_ms, 250.0);
  // The window held the lone request for 50 ms of the clock (5 ms waits), not of the wall.
  EXPECT_GE(out.scheduled_ms, 300.0);
  EXPECT_LT(out.scheduled_ms, 320.0);
  EXPECT_EQ(out.first_token_ms, out.scheduled_ms);
  EXPECT_EQ(out.tokens.size(), static_cast<size_t>(reqs[0].max_tokens));
  EXPECT_NEAR(out.tpot_ms(), 10.0, 1e-6);
  EXPECT_LT(std::chrono::steady_clock::now() - wall, std::chrono::seconds(5));
}

}  // namespace
}  // namespace specula

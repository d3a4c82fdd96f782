// Logprobs, prompt logprobs, penalties and logit_bias through the real engine on the TinyStories
// pair: a generated token's logprobs equal the log-softmax of the engine's own teacher-forced logits
// (the same tokens scored as a prompt), speculative or not; and penalized greedy decoding picks what
// OpenAI's penalty formula, applied to the full raw distribution, says.
#include <cmath>
#include <map>

#include "draft/draft_model_proposer.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/test_util.h"

namespace specula {
namespace {

class LogprobsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = testing::TinyStoriesDir();
    for (auto [path, dst] : {std::pair{"/stories260K.bin", &target_}, {"/stories260K-draft.bin", &draft_}}) {
      auto w = LoadModel(dir + path);
      ASSERT_TRUE(w.ok()) << w.status();
      *dst = new LlamaModel(std::move(w).value(), MakeCpuBackend());
    }
    auto tok = LoadTokenizer(dir + "/tok512.bin", 512);
    ASSERT_TRUE(tok.ok());
    tok_ = std::move(tok).value().release();
  }

  static SchedulerConfig Config(int32_t k, int32_t batched_tokens = 1024, bool caching = true) {
    SchedulerConfig c;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = batched_tokens;
    c.block_size = 16;
    c.num_blocks = 256;
    c.max_model_len = target_->config().max_seq_len;
    c.num_spec_tokens = k;
    c.enable_prefix_caching = caching;
    return c;
  }

  static std::map<RequestId, RequestOutput> Run(Engine& e, const std::vector<Request>& reqs) {
    for (const Request& r : reqs) EXPECT_TRUE(e.AddRequest(r).ok());
    std::map<RequestId, RequestOutput> out;
    std::map<RequestId, size_t> streamed;  // logprobs the deltas carried: one per token
    for (int steps = 0; e.HasUnfinished() && steps < 100000; ++steps) {
      for (RequestDelta& d : e.Step()) {
        EXPECT_TRUE(d.logprobs.empty() || d.logprobs.size() == d.tokens.size());
        streamed[d.id] += d.logprobs.size();
        if (d.finished) out.emplace(d.id, std::move(d.final));
      }
    }
    for (auto& [id, o] : out) {
      if (!o.logprobs.empty()) {
        EXPECT_EQ(streamed[id], o.tokens.size());
      }
    }
    return out;
  }

  std::vector<Request> Prompts(int32_t logprobs, float temperature) const {
    std::vector<Request> reqs;
    const char* texts[] = {"Lily went to the park", "Tom had a big red ball and", "The bird", "Once upon a time"};
    for (int i = 0; i < 4; ++i) {
      Request r;
      r.id = i;
      r.prompt = tok_->Encode(texts[i], true);
      r.max_tokens = 20;
      r.ignore_eos = true;
      r.logprobs = logprobs;
      r.sampling.temperature = temperature;
      r.sampling.seed = 7 + i;
      reqs.push_back(std::move(r));
    }
    return reqs;
  }

  // Scores prompt + generated tokens as one prompt (the teacher-forced logits) and compares.
  static void ExpectTeacherForced(const std::vector<Request>& reqs, std::map<RequestId, RequestOutput>& got,
                                  const char* name) {
    std::vector<Request> forced;
    for (const Request& r : reqs) {
      Request f;
      f.id = 1000 + r.id;
      f.prompt = r.prompt;
      f.prompt.insert(f.prompt.end(), got[r.id].tokens.begin(), got[r.id].tokens.end());
      f.max_tokens = 1;
      f.prompt_logprobs = r.logprobs;
      forced.push_back(std::move(f));
    }
    Engine e(target_, nullptr, Config(0, 48));  // chunked: 48 tokens a step
    auto scored = Run(e, forced);
    for (const Request& r : reqs) {
      const RequestOutput& g = got[r.id];
      const RequestOutput& f = scored[1000 + r.id];
      ASSERT_EQ(g.logprobs.size(), g.tokens.size()) << name;
      ASSERT_EQ(f.prompt_logprobs.size(), r.prompt.size() + g.tokens.size() - 1) << name;
      for (size_t j = 0; j < g.tokens.size(); ++j) {
        const TokenLogprobs& a = g.logprobs[j];
        const TokenLogprobs& b = f.prompt_logprobs[r.prompt.size() - 1 + j];
        ASSERT_EQ(a.token, g.tokens[j]);
        ASSERT_EQ(b.token, g.tokens[j]);
        EXPECT_NEAR(a.logprob, b.logprob, 1e-5) << name << " request " << r.id << " token " << j;
        ASSERT_EQ(a.top.size(), static_cast<size_t>(r.logprobs));
        for (size_t t = 0; t < a.top.size(); ++t) EXPECT_NEAR(a.top[t].second, b.top[t].second, 1e-5) << name;
      }
    }
  }

  static LlamaModel* target_;
  static LlamaModel* draft_;
  static Tokenizer* tok_;
};
LlamaModel* LogprobsTest::target_ = nullptr;
LlamaModel* LogprobsTest::draft_ = nullptr;
Tokenizer* LogprobsTest::tok_ = nullptr;

TEST_F(LogprobsTest, EqualTheTeacherForcedLogSoftmaxSpeculativeOrNot) {
  for (float temperature : {0.0f, 0.8f}) {
    std::vector<Request> reqs = Prompts(5, temperature);
    Engine plain(target_, nullptr, Config(0));
    auto got = Run(plain, reqs);
    ExpectTeacherForced(reqs, got, temperature == 0 ? "plain greedy" : "plain sampled");
    DraftModelProposer proposer(draft_, 16, 512);
    Engine spec(target_, nullptr, Config(3), SpecConfig{&proposer});
    auto spec_got = Run(spec, reqs);
    EXPECT_GT(spec.stats().spec.accepted_tokens, 0);
    ExpectTeacherForced(reqs, spec_got, temperature == 0 ? "speculative greedy" : "speculative sampled");
    if (temperature == 0) {
      for (auto& [id, o] : got) EXPECT_EQ(o.tokens, spec_got[id].tokens);
    }
  }
}

TEST_F(LogprobsTest, TopListsTheMostLikelyBestFirst) {
  std::vector<Request> reqs = Prompts(512, 0.0f);  // the whole vocabulary
  reqs.resize(1);
  Engine e(target_, nullptr, Config(0));
  auto got = Run(e, reqs);
  for (const TokenLogprobs& lp : got[0].logprobs) {
    ASSERT_EQ(lp.top.size(), 512u);
    double mass = 0;
    for (size_t t = 0; t < lp.top.size(); ++t) {
      mass += std::exp(lp.top[t].second);
      if (t > 0) {
        EXPECT_GE(lp.top[t - 1].second, lp.top[t].second);
      }
    }
    EXPECT_NEAR(mass, 1.0, 1e-4);
    EXPECT_EQ(lp.top[0].first, lp.token);  // greedy: the chosen token is the most likely
    EXPECT_FLOAT_EQ(lp.top[0].second, lp.logprob);
  }
}

// Prompt logprobs skip the prefix cache (every position is computed), survive chunking, and start
// at the second prompt token.
TEST_F(LogprobsTest, PromptLogprobsWithPrefixCachingAndChunks) {
  Request a;
  a.id = 1;
  a.prompt = tok_->Encode("Lily went to the park with her mom and her dog. They saw a big tree and", true);
  a.max_tokens = 2;
  Request b = a;
  b.id = 2;
  b.prompt_logprobs = 2;
  for (int32_t batched : {1024, 7}) {
    Engine e(target_, nullptr, Config(0, batched));
    Run(e, {a});  // its blocks are now cached
    auto got = Run(e, {b});
    ASSERT_EQ(got[2].prompt_logprobs.size(), b.prompt.size() - 1) << batched;
    EXPECT_EQ(got[2].cached_prompt_tokens, 0);
    for (size_t p = 1; p < b.prompt.size(); ++p) {
      EXPECT_EQ(got[2].prompt_logprobs[p - 1].token, b.prompt[p]);
      EXPECT_EQ(got[2].prompt_logprobs[p - 1].top.size(), 2u);
    }
  }
}

// Greedy with penalties and biases: each token is the argmax of the raw log-softmax (all 512
// logprobs, returned with it) after OpenAI's formula, with counts over the tokens generated so far.
TEST_F(LogprobsTest, PenaltiesAndLogitBiasFollowTheReferenceFormula) {
  std::vector<Request> reqs = Prompts(512, 0.0f);
  std::vector<Request> plain_reqs = reqs;
  for (Request& r : reqs) {
    r.sampling.frequency_penalty = 1.5f;
    r.sampling.presence_penalty = 0.5f;
    r.sampling.logit_bias = {{tok_->Encode("the", false)[0], 2.0f}, {tok_->Encode(".", false)[0], -100.0f}};
  }
  Engine e(target_, nullptr, Config(0));
  auto got = Run(e, reqs);
  Engine p(target_, nullptr, Config(0));
  auto plain = Run(p, plain_reqs);
  int differ = 0;
  for (const Request& r : reqs) {
    const RequestOutput& o = got[r.id];
    differ += o.tokens != plain[r.id].tokens;
    std::map<TokenId, int> count;
    for (size_t j = 0; j < o.tokens.size(); ++j) {
      std::vector<double> score(512);
      for (const auto& [id, lp] : o.logprobs[j].top) score[id] = lp;
      for (const auto& [id, bias] : r.sampling.logit_bias) score[id] += bias;
      for (const auto& [id, c] : count) score[id] -= 1.5 * c + 0.5;
      const TokenId want = static_cast<TokenId>(std::max_element(score.begin(), score.end()) - score.begin());
      EXPECT_EQ(o.tokens[j], want) << "request " << r.id << " token " << j;
      ++count[o.tokens[j]];
    }
  }
  EXPECT_GT(differ, 0);  // the penalties changed something
}

}  // namespace
}  // namespace specula

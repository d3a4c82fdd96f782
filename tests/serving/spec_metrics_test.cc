// Per-request speculative-decoding metrics as the responses carry them: the object's counts, rates
// and padded histogram (serving/spec_metrics.h), and where the OpenAI responder puts it: the root's
// `metrics.speculative_decoding` for one choice (the body, or the stream's usage chunk), null there
// and one per choice for n > 1 (streamed: on each choice's last chunk), nothing for a request without
// drafts on a server without a proposer or with the metrics turned off; structured output's forced
// and cut drafts beside the counts, and a server without a proposer answering with them where its
// grammar forced drafts. Beside them, a shared KV store's per-request timings.
#include "serving/spec_metrics.h"

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "draft/ngram_proposer.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama_model.h"
#include "nlohmann/json.hpp"
#include "serving/openai_api.h"
#include "serving/server.h"
#include "tests/test_util.h"
#include "tests/tiny_stories.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

using json = nlohmann::json;

// Four verifications of up to 3 drafts (k = 4 configured): 1 of 3, 3 of 3, 0 of 3 and 2 of 2 accepted.
SpecStats FourSteps() {
  SpecStats s;
  s.Record(3, 1);
  s.Record(3, 3);
  s.Record(3, 0);
  s.Record(2, 2);
  return s;
}

// No proposer: two verifications of the grammar's forced drafts alone, 5 of 5 and 1 of 2 accepted.
SpecStats ForcedOnly() {
  SpecStats s;
  s.Record(5, 5);
  s.RecordGrammar(5, 5, 0);
  s.Record(2, 1);
  s.RecordGrammar(2, 1, 0);
  return s;
}

TEST(SpecDecodingJsonTest, CountsRatesAndTheHistogramPaddedToK) {
  const json j = SpecDecodingJson(FourSteps(), 4);
  EXPECT_EQ(j["num_spec_tokens"], 4);
  EXPECT_EQ(j["num_spec_steps"], 4);
  EXPECT_EQ(j["num_draft_tokens"], 11);
  EXPECT_EQ(j["num_accepted_draft_tokens"], 6);
  // Index j: steps that accepted exactly j drafts; k + 1 entries although no step drafted 4.
  EXPECT_EQ(j["acceptance_histogram"], json({1, 1, 1, 1, 0}));
  EXPECT_DOUBLE_EQ(j["mean_acceptance_length"].get<double>(), 1.0 + 6.0 / 4.0);  // the bonus token counted
  EXPECT_DOUBLE_EQ(j["draft_acceptance_rate"].get<double>(), 6.0 / 11.0);
  EXPECT_EQ(j["accepted_per_position"], json({3, 2, 1, 0}));
  EXPECT_EQ(j["reached_per_position"], json({4, 3, 1, 0}));
  int64_t steps = 0, accepted = 0;
  for (size_t i = 0; i < j["acceptance_histogram"].size(); ++i) {
    steps += j["acceptance_histogram"][i].get<int64_t>();
    accepted += static_cast<int64_t>(i) * j["acceptance_histogram"][i].get<int64_t>();
  }
  EXPECT_EQ(steps, j["num_spec_steps"].get<int64_t>());
  EXPECT_EQ(accepted, j["num_accepted_draft_tokens"].get<int64_t>());
}

TEST(SpecDecodingJsonTest, ARequestThatNeverDraftedHasZerosAndLengthOne) {
  const json j = SpecDecodingJson(SpecStats{}, 3);
  EXPECT_EQ(j["acceptance_histogram"], json({0, 0, 0, 0}));
  EXPECT_EQ(j["num_spec_steps"], 0);
  EXPECT_EQ(j["num_draft_tokens"], 0);
  EXPECT_DOUBLE_EQ(j["mean_acceptance_length"].get<double>(), 1.0);  // one token a step, as vLLM reports
  EXPECT_DOUBLE_EQ(j["draft_acceptance_rate"].get<double>(), 0.0);
  EXPECT_EQ(j["accepted_per_position"], json({0, 0, 0}));
  EXPECT_EQ(j["reached_per_position"], json({0, 0, 0}));
  EXPECT_EQ(j["num_forced_draft_tokens"], 0);
  EXPECT_EQ(j["num_accepted_forced_tokens"], 0);
  EXPECT_EQ(j["num_grammar_cut_tokens"], 0);
}

TEST(SpecDecodingJsonTest, ForcedAndCutDraftsBesideTheCounts) {
  // With a proposer (k = 3): 2 forced drafts and 1 proposed (1 more proposed, cut), 2 accepted; then
  // 3 proposed, none forced, 2 cut, 0 accepted.
  SpecStats s;
  s.Record(3, 2);
  s.RecordGrammar(2, 2, 1);
  s.Record(3, 0);
  s.RecordGrammar(0, 0, 2);
  const json j = SpecDecodingJson(s, 3);
  EXPECT_EQ(j["num_draft_tokens"], 6);  // the forced ones counted; the cut ones never verified
  EXPECT_EQ(j["num_accepted_draft_tokens"], 2);
  EXPECT_EQ(j["num_forced_draft_tokens"], 2);
  EXPECT_EQ(j["num_accepted_forced_tokens"], 2);
  EXPECT_EQ(j["num_grammar_cut_tokens"], 3);
  const SpecDecodingMetrics m = SpecDecodingMetricsOf(s, 3);
  EXPECT_EQ((std::tuple{m.num_forced_draft_tokens, m.num_accepted_forced_tokens, m.num_grammar_cut_tokens}),
            (std::tuple{2, 2, 3}));
}

TEST(SpecDecodingJsonTest, ForcedDraftsWithoutAProposerSizeTheHistogram) {
  // k = 0: the buckets come from the longest forced draft (5), not from k.
  const json j = SpecDecodingJson(ForcedOnly(), 0);
  EXPECT_EQ(j["num_spec_tokens"], 0);
  EXPECT_EQ(j["num_spec_steps"], 2);
  EXPECT_EQ(j["num_draft_tokens"], 7);
  EXPECT_EQ(j["num_accepted_draft_tokens"], 6);
  EXPECT_EQ(j["acceptance_histogram"], json({0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(j["accepted_per_position"], json({2, 1, 1, 1, 1}));
  EXPECT_EQ(j["reached_per_position"], json({2, 2, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(j["mean_acceptance_length"].get<double>(), 1.0 + 6.0 / 2.0);
  EXPECT_EQ(j["num_forced_draft_tokens"], 7);
  EXPECT_EQ(j["num_accepted_forced_tokens"], 6);
  EXPECT_EQ(j["num_grammar_cut_tokens"], 0);
}

TEST(SpecDecodingJsonTest, WhichRequestsShowThem) {
  EXPECT_TRUE(ShowsSpecDecoding(SpecStats{}, 3));      // a proposer: zeros for a request without drafts
  EXPECT_TRUE(ShowsSpecDecoding(FourSteps(), 3));
  EXPECT_FALSE(ShowsSpecDecoding(SpecStats{}, 0));     // no proposer, no drafts: none at all
  EXPECT_TRUE(ShowsSpecDecoding(ForcedOnly(), 0));     // no proposer, the grammar's drafts
  EXPECT_FALSE(ShowsSpecDecoding(ForcedOnly(), -1));   // turned off
  EXPECT_FALSE(ShowsSpecDecoding(FourSteps(), -1));
}

TEST(SpecDecodingJsonTest, TheStructAndTheJsonAgree) {
  const SpecDecodingMetrics m = SpecDecodingMetricsOf(FourSteps(), 4);
  const json j = SpecDecodingJson(FourSteps(), 4);
  EXPECT_EQ(json(m.acceptance_histogram), j["acceptance_histogram"]);
  EXPECT_EQ(m.num_spec_steps, j["num_spec_steps"].get<int64_t>());
  EXPECT_DOUBLE_EQ(m.mean_acceptance_length, j["mean_acceptance_length"].get<double>());
  EXPECT_EQ(json(m.reached_per_position), j["reached_per_position"]);
}

// A server speculating with n-grams (k = 3) on the TinyStories target, or none, or with the metrics
// off. The responder takes only the prompt, n and spec_metrics_tokens from a generation: the deltas
// fed to it here are made up, so every count in the output is known.
class ResponderSpecMetricsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::tie(model_, tok_) = testing::TinyStoriesTarget();
    ASSERT_NE(model_, nullptr);
    ASSERT_NE(tok_, nullptr);
  }
  void Start(int32_t k, bool metrics_on, bool kv_store = false) {
    SchedulerConfig c;
    c.max_num_seqs = 4;
    c.block_size = 16;
    c.num_blocks = 128;
    c.max_model_len = model_->config().max_seq_len;
    c.num_spec_tokens = k;
    SpecConfig spec;
    if (k > 0) spec.proposer = &ngram_;
    engine_ = std::make_unique<Engine>(model_, tok_, c, spec);
    ServeOptions opt;
    opt.model_name = "m";
    opt.spec_metrics = metrics_on;
    opt.kv_store = kv_store;
    server_ = std::make_unique<Server>(engine_.get(), tok_, model_->config(), opt);
  }
  void TearDown() override {
    gen_.reset();
    server_.reset();
    engine_.reset();
  }

  std::unique_ptr<OpenAiResponder> Responder(int32_t n, bool stream, bool usage, bool chat = false) {
    ServeRequest r;
    r.prompt = "Once upon a time";
    r.n = n;
    r.max_tokens = 2;
    auto g = server_->Generate(r);
    EXPECT_TRUE(g.ok()) << g.status();
    gen_ = *g;
    HttpRequestBody call;
    call.request = r;
    call.chat = chat;
    call.stream = stream;
    call.usage_in_stream = usage;
    call.n = n;
    return std::make_unique<OpenAiResponder>(call, "m", "cmpl-1", *gen_, tok_);
  }

  static RequestDelta Last(const SpecStats& spec) {
    RequestDelta d;
    d.tokens = {5, 6};
    d.text = "ab";
    d.finished = true;
    d.final.tokens = d.tokens;
    d.final.finish = FinishReason::kMaxTokens;
    d.final.spec = spec;
    return d;
  }

  // The JSON of each `data:` event but [DONE].
  static std::vector<json> Events(const std::string& sse) {
    std::vector<json> out;
    size_t at = 0;
    while ((at = sse.find("data: ", at)) != std::string::npos) {
      const size_t end = sse.find("\n\n", at);
      const std::string payload = sse.substr(at + 6, end - at - 6);
      if (payload != "[DONE]") out.push_back(json::parse(payload));
      at = end;
    }
    return out;
  }

  static LlamaModel* model_;
  static Tokenizer* tok_;
  NgramProposer ngram_{1, 3};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<Generation> gen_;
};
LlamaModel* ResponderSpecMetricsTest::model_ = nullptr;
Tokenizer* ResponderSpecMetricsTest::tok_ = nullptr;

TEST_F(ResponderSpecMetricsTest, OneChoiceCarriesItAtTheRoot) {
  Start(3, true);
  for (bool chat : {false, true}) {
    auto r = Responder(1, false, false, chat);
    auto body = r->Add(0, Last(FourSteps()));
    ASSERT_TRUE(body.ok()) << body.status();
    const json j = json::parse(*body);
    EXPECT_EQ(j["metrics"]["speculative_decoding"], SpecDecodingJson(FourSteps(), 3)) << j.dump();
    EXPECT_EQ(j["metrics"]["speculative_decoding"]["num_spec_tokens"], 3);
    EXPECT_FALSE(j["choices"][0].contains("metrics"));
  }
}

TEST_F(ResponderSpecMetricsTest, TwoChoicesCarryOneEachAndTheRootNull) {
  Start(3, true);
  SpecStats other;
  other.Record(3, 3);
  auto r = Responder(2, false, false);
  EXPECT_EQ(*r->Add(1, Last(other)), "");  // the body waits for every sample
  const json j = json::parse(*r->Add(0, Last(FourSteps())));
  EXPECT_TRUE(j["metrics"]["speculative_decoding"].is_null()) << j.dump();
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["metrics"]["speculative_decoding"], SpecDecodingJson(FourSteps(), 3));
  EXPECT_EQ(j["choices"][1]["metrics"]["speculative_decoding"], SpecDecodingJson(other, 3));
  EXPECT_EQ(j["choices"][1]["metrics"]["speculative_decoding"]["acceptance_histogram"], json({0, 0, 0, 1}));
}

TEST_F(ResponderSpecMetricsTest, StreamedOneChoiceRidesTheUsageChunkOnly) {
  Start(3, true);
  auto r = Responder(1, true, true);
  const std::vector<json> events = Events(*r->Add(0, Last(FourSteps())));
  ASSERT_EQ(events.size(), 2u);  // the finishing chunk, then usage
  EXPECT_EQ(events[0]["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(events[0].contains("metrics"));
  EXPECT_FALSE(events[0]["choices"][0].contains("metrics"));
  EXPECT_TRUE(events[1]["choices"].empty());
  EXPECT_EQ(events[1]["metrics"]["speculative_decoding"], SpecDecodingJson(FourSteps(), 3));
  // Without include_usage there is no usage chunk, and so none (as vLLM).
  auto plain = Responder(1, true, false);
  for (const json& e : Events(*plain->Add(0, Last(FourSteps())))) {
    EXPECT_FALSE(e.contains("metrics")) << e.dump();
    EXPECT_FALSE(e["choices"][0].contains("metrics")) << e.dump();
  }
}

TEST_F(ResponderSpecMetricsTest, StreamedChoicesCarryTheirsOnTheirLastChunk) {
  Start(3, true);
  SpecStats other;
  other.Record(1, 0);
  auto r = Responder(2, true, true);
  const std::vector<json> first = Events(*r->Add(1, Last(other)));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["choices"][0]["index"], 1);
  EXPECT_EQ(first[0]["choices"][0]["metrics"]["speculative_decoding"], SpecDecodingJson(other, 3));
  const std::vector<json> rest = Events(*r->Add(0, Last(FourSteps())));
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0]["choices"][0]["metrics"]["speculative_decoding"], SpecDecodingJson(FourSteps(), 3));
  EXPECT_TRUE(rest[1]["metrics"]["speculative_decoding"].is_null());  // the usage chunk: null for n > 1
}

TEST_F(ResponderSpecMetricsTest, NoDraftsWithoutAProposerOrMetricsOffLeaveTheResponseAsItWas) {
  // No proposer and a request without drafts; a proposer's drafts with the metrics off.
  for (auto [k, on, spec] : {std::tuple{0, true, SpecStats{}}, std::tuple{3, false, FourSteps()}}) {
    Start(k, on);
    EXPECT_EQ(server_->spec_metrics_tokens(*server_->Current()), on ? 0 : -1);
    for (int32_t n : {1, 2}) {
      auto body = Responder(n, false, false);
      std::string text;
      for (int32_t i = 0; i < n; ++i) text = *body->Add(i, Last(spec));
      EXPECT_FALSE(json::parse(text).contains("metrics")) << text;
      auto stream = Responder(n, true, true);
      for (int32_t i = 0; i < n; ++i) {
        EXPECT_EQ(stream->Add(i, Last(spec))->find("metrics"), std::string::npos) << "k " << k << " n " << n;
      }
    }
    TearDown();
  }
}

TEST_F(ResponderSpecMetricsTest, ForcedDraftsWithoutAProposerShowTheirs) {
  Start(0, true);
  EXPECT_EQ(server_->spec_metrics_tokens(*server_->Current()), 0);
  auto one = Responder(1, false, false);
  const json j = json::parse(*one->Add(0, Last(ForcedOnly())));
  EXPECT_EQ(j["metrics"]["speculative_decoding"], SpecDecodingJson(ForcedOnly(), 0)) << j.dump();
  EXPECT_EQ(j["metrics"]["speculative_decoding"]["num_forced_draft_tokens"], 7);
  // n = 2, one sample with forced drafts: the root null, that choice's own, nothing on the other.
  auto two = Responder(2, false, false);
  EXPECT_EQ(*two->Add(1, Last(SpecStats{})), "");
  const json both = json::parse(*two->Add(0, Last(ForcedOnly())));
  EXPECT_TRUE(both["metrics"]["speculative_decoding"].is_null()) << both.dump();
  EXPECT_EQ(both["choices"][0]["metrics"]["speculative_decoding"], SpecDecodingJson(ForcedOnly(), 0));
  EXPECT_FALSE(both["choices"][1].contains("metrics")) << both.dump();
  // Streamed, the same: one choice's on the usage chunk; with n = 2 on the last chunk of the one that
  // had drafts, null on the usage chunk.
  auto streamed = Responder(1, true, true);
  const std::vector<json> events = Events(*streamed->Add(0, Last(ForcedOnly())));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["metrics"]["speculative_decoding"], SpecDecodingJson(ForcedOnly(), 0));
  auto streamed_two = Responder(2, true, true);
  const std::vector<json> first = Events(*streamed_two->Add(1, Last(SpecStats{})));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_FALSE(first[0]["choices"][0].contains("metrics")) << first[0].dump();
  const std::vector<json> rest = Events(*streamed_two->Add(0, Last(ForcedOnly())));
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0]["choices"][0]["metrics"]["speculative_decoding"], SpecDecodingJson(ForcedOnly(), 0));
  EXPECT_TRUE(rest[1]["metrics"]["speculative_decoding"].is_null()) << rest[1].dump();
}

// On a server with a shared KV store, `metrics.kv_store` beside speculative decoding's at the root (the
// body, the stream's usage chunk), from sample 0's output as the usage's cached tokens; nothing on a
// server without one.
TEST_F(ResponderSpecMetricsTest, KvStoreTimingsRideTheRootBesideSpeculativeDecoding) {
  auto with_store = [](RequestDelta d, int32_t fetched) {
    d.final.prompt_tokens = 40;
    d.final.cached_prompt_tokens = fetched + 16;
    d.final.kv_store_tokens = fetched;
    d.final.kv_fetch_ms = 1.5;
    d.final.kv_install_ms = 0.25;
    return d;
  };
  const json want = {{"fetched_tokens", 32}, {"fetch_ms", 1.5}, {"install_ms", 0.25}};
  Start(3, true, true);
  const json one = json::parse(*Responder(1, false, false)->Add(0, with_store(Last(FourSteps()), 32)));
  EXPECT_EQ(one["metrics"]["kv_store"], want) << one.dump();
  EXPECT_EQ(one["metrics"]["speculative_decoding"], SpecDecodingJson(FourSteps(), 3));
  EXPECT_EQ(one["usage"]["prompt_tokens_details"]["cached_tokens"], 48);
  auto two = Responder(2, false, false);
  EXPECT_EQ(*two->Add(1, with_store(Last(FourSteps()), 0)), "");
  const json both = json::parse(*two->Add(0, with_store(Last(FourSteps()), 32)));
  EXPECT_TRUE(both["metrics"]["speculative_decoding"].is_null()) << both.dump();
  EXPECT_EQ(both["metrics"]["kv_store"], want);
  EXPECT_FALSE(both["choices"][0]["metrics"].contains("kv_store"));
  const std::vector<json> events = Events(*Responder(1, true, true)->Add(0, with_store(Last(FourSteps()), 32)));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(events[0].contains("metrics"));
  EXPECT_EQ(events[1]["metrics"]["kv_store"], want) << events[1].dump();
  EXPECT_EQ(events[1]["usage"]["prompt_tokens_details"]["cached_tokens"], 48);
  TearDown();
  Start(0, true, false);  // no store, no drafts: no metrics at all
  const json plain = json::parse(*Responder(1, false, false)->Add(0, with_store(Last(SpecStats{}), 0)));
  EXPECT_FALSE(plain.contains("metrics")) << plain.dump();
  EXPECT_EQ(plain["usage"]["prompt_tokens_details"]["cached_tokens"], 16);
}

}  // namespace
}  // namespace specula

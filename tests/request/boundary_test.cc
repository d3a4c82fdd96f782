// The request boundary over its table: every row's max_tokens default and what it gets past the
// room the prompt leaves, every bound (max_tokens, logprobs, n, empty stops), the seed's rule, the
// prompt's checks, and each error's field name as its surface names it; and the finish names. Expectations come from the
// row under test; a few anchors pin the values serving has always had (OpenAI's 16 and 20).
#include "request/boundary.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "request/finish.h"

namespace specula {
namespace {

constexpr int32_t kVocab = 300;
constexpr int32_t kContext = 64;
constexpr int32_t kConfigured = 20;  // the context's default_max_tokens (--max-tokens, workload.max_tokens)

// A tokenizer stand-in: one token per byte, BOS (1) first when asked.
RequestContext Context(int32_t default_max_tokens = kConfigured) {
  RequestContext c;
  c.vocab_size = kVocab;
  c.max_model_len = kContext;
  c.default_max_tokens = default_max_tokens;
  c.encode = [](std::string_view text, bool add_bos) {
    std::vector<TokenId> ids;
    if (add_bos) ids.push_back(1);
    for (unsigned char ch : text) ids.push_back(2 + ch);
    return ids;
  };
  return c;
}

std::vector<TokenId> Ids(int32_t n) { return std::vector<TokenId>(n, 5); }

absl::StatusOr<std::vector<TokenId>> Normalize(Surface s, RequestSpec* spec, const std::vector<TokenId>& ids,
                                               const RequestContext& c = Context()) {
  PromptInput p;
  p.ids = ids;
  return NormalizeRequest(s, c, p, spec);
}

// The field an error names: what precedes the first ':' (HTTP's `param` takes the same).
std::string FieldOf(const absl::Status& st) {
  const std::string m(st.message());
  return m.substr(0, m.find(':'));
}

std::string Prefixed(const SurfaceRules& r, const std::string& field) { return r.field_prefix + field; }

TEST(RequestBoundaryTest, AnchorsOfServing) {
  EXPECT_EQ(RulesOf(Surface::kCompletions).length_default, LengthDefault::kFixed);
  EXPECT_EQ(RulesOf(Surface::kCompletions).fixed_max_tokens, 16);  // OpenAI's
  for (Surface s : {Surface::kCompletions, Surface::kChat, Surface::kGrpc, Surface::kInProcess}) {
    EXPECT_EQ(RulesOf(s).max_logprobs, 20) << RulesOf(s).name;
    EXPECT_EQ(RulesOf(s).max_n, 128) << RulesOf(s).name;
  }
  EXPECT_EQ(std::string(RulesOf(Surface::kGrpc).field_prefix), "sampling.");
  EXPECT_EQ(RulesOf(Surface::kExperiment).configured_default, kWorkloadMaxTokensDefault);
  EXPECT_EQ(RulesOf(Surface::kPromptsFile).configured_default, kMaxTokensFlagDefault);
}

TEST(RequestBoundaryTest, TheTableHasEveryRowOnce) {
  ASSERT_EQ(SurfaceTable().size(), static_cast<size_t>(kNumSurfaces));
  for (int i = 0; i < kNumSurfaces; ++i) {
    EXPECT_EQ(static_cast<int>(SurfaceTable()[i].surface), i);
    EXPECT_EQ(&RulesOf(static_cast<Surface>(i)), &SurfaceTable()[i]);
  }
}

// max_tokens 0: the row's default, and a default past the room refused, capped or kept.
TEST(RequestBoundaryTest, EachRowsDefaultLength) {
  for (const SurfaceRules& r : SurfaceTable()) {
    SCOPED_TRACE(r.name);
    RequestSpec spec;
    auto ids = Normalize(r.surface, &spec, Ids(10));
    if (r.length_default == LengthDefault::kNone) {
      ASSERT_FALSE(ids.ok());
      EXPECT_EQ(FieldOf(ids.status()), Prefixed(r, "max_tokens"));
      continue;
    }
    ASSERT_TRUE(ids.ok()) << ids.status();
    const int32_t want = r.length_default == LengthDefault::kFixed ? r.fixed_max_tokens : kConfigured;
    EXPECT_EQ(spec.max_tokens, want);
    // No configured default: the row's own.
    RequestSpec unset;
    ASSERT_TRUE(Normalize(r.surface, &unset, Ids(10), Context(0)).ok());
    const int32_t own = r.length_default == LengthDefault::kFixed ? r.fixed_max_tokens : r.configured_default;
    EXPECT_EQ(unset.max_tokens, r.default_over_room == OverRoom::kCapped ? std::min(own, kContext - 10) : own);
    // Past the room: a prompt that leaves 3 tokens.
    RequestSpec tight;
    auto past = Normalize(r.surface, &tight, Ids(kContext - 3));
    switch (r.default_over_room) {
      case OverRoom::kRefused:
        ASSERT_FALSE(past.ok());
        EXPECT_EQ(FieldOf(past.status()), Prefixed(r, "max_tokens"));
        EXPECT_NE(past.status().message().find("at most 3 here"), std::string::npos) << past.status();
        break;
      case OverRoom::kCapped:
        ASSERT_TRUE(past.ok()) << past.status();
        EXPECT_EQ(tight.max_tokens, 3);
        break;
      case OverRoom::kRunsToContext:
        ASSERT_TRUE(past.ok()) << past.status();
        EXPECT_EQ(tight.max_tokens, want);
        break;
    }
  }
}

// A given max_tokens: its bounds, and past the room refused, capped or kept.
TEST(RequestBoundaryTest, EachRowsGivenLength) {
  for (const SurfaceRules& r : SurfaceTable()) {
    SCOPED_TRACE(r.name);
    RequestSpec spec;
    spec.max_tokens = 7;
    ASSERT_TRUE(Normalize(r.surface, &spec, Ids(10)).ok());
    EXPECT_EQ(spec.max_tokens, 7);
    for (int64_t bad : {int64_t{-3}, int64_t{r.max_max_tokens} + 1}) {
      if (bad > std::numeric_limits<int32_t>::max()) continue;
      RequestSpec b;
      b.max_tokens = static_cast<int32_t>(bad);
      auto st = Normalize(r.surface, &b, Ids(10), RequestContext{Context()});
      ASSERT_FALSE(st.ok()) << bad;
      EXPECT_EQ(FieldOf(st.status()), Prefixed(r, "max_tokens")) << st.status();
      EXPECT_FALSE(CheckGivenMaxTokens(r.surface, bad).ok()) << bad;
    }
    EXPECT_FALSE(CheckGivenMaxTokens(r.surface, 0).ok());  // a given 0 is no default
    EXPECT_TRUE(CheckGivenMaxTokens(r.surface, r.max_max_tokens).ok());
    RequestSpec tight;
    tight.max_tokens = 10;
    auto past = Normalize(r.surface, &tight, Ids(kContext - 3));
    if (r.given_over_room == OverRoom::kRefused) {
      ASSERT_FALSE(past.ok());
      EXPECT_EQ(FieldOf(past.status()), Prefixed(r, "max_tokens"));
      EXPECT_NE(past.status().message().find("exceed the context of 64 tokens"), std::string::npos) << past.status();
    } else {
      ASSERT_TRUE(past.ok()) << past.status();
      EXPECT_EQ(tight.max_tokens, r.given_over_room == OverRoom::kCapped ? 3 : 10);
    }
  }
  // The prompts file's upper bound (a JSON line's max_tokens).
  EXPECT_EQ(RulesOf(Surface::kPromptsFile).max_max_tokens, 1 << 24);
}

TEST(RequestBoundaryTest, LogprobsAndSamplesInEachRowsBounds) {
  for (const SurfaceRules& r : SurfaceTable()) {
    SCOPED_TRACE(r.name);
    const int32_t most = r.max_logprobs == kVocabularyBound ? kVocab : r.max_logprobs;
    for (const char* field : {"logprobs", "prompt_logprobs"}) {
      for (int32_t v : {-1, 0, most, most + 1, -2}) {
        RequestSpec spec;
        spec.max_tokens = 4;
        (std::string(field) == "logprobs" ? spec.logprobs : spec.prompt_logprobs) = v;
        auto st = Normalize(r.surface, &spec, Ids(5));
        EXPECT_EQ(st.ok(), v >= -1 && v <= most) << field << " " << v;
        if (!st.ok()) {
          EXPECT_EQ(FieldOf(st.status()), Prefixed(r, field));
        }
      }
    }
    for (int32_t n : {1, r.max_n, r.max_n + 1, 0}) {
      RequestSpec spec;
      spec.max_tokens = 4;
      spec.n = n;
      auto st = Normalize(r.surface, &spec, Ids(5));
      EXPECT_EQ(st.ok(), n >= 1 && n <= r.max_n) << n;
      if (!st.ok()) {
        EXPECT_EQ(FieldOf(st.status()), Prefixed(r, "n"));
      }
    }
  }
}

TEST(RequestBoundaryTest, StopsBiasesSamplingAndConstraintNameTheirField) {
  for (const SurfaceRules& r : SurfaceTable()) {
    SCOPED_TRACE(r.name);
    RequestSpec empty_stop;
    empty_stop.max_tokens = 4;
    empty_stop.stop_strings = {"end", ""};
    auto st = Normalize(r.surface, &empty_stop, Ids(5));
    EXPECT_EQ(st.ok(), !r.refuse_empty_stop);
    if (!st.ok()) {
      EXPECT_EQ(FieldOf(st.status()), Prefixed(r, "stop[1]"));
    }
    struct Case {
      std::string field;
      void (*set)(RequestSpec*);
    };
    for (const Case& c : {Case{"logit_bias", [](RequestSpec* s) { s->sampling.logit_bias = {{kVocab, 1.0f}}; }},
                          Case{"logit_bias", [](RequestSpec* s) { s->sampling.logit_bias = {{-1, 1.0f}}; }},
                          Case{"logit_bias[3] must be in [-100, 100], got 101",
                               [](RequestSpec* s) { s->sampling.logit_bias = {{3, 101.0f}}; }},
                          Case{"temperature must be >= 0, got -1", [](RequestSpec* s) { s->sampling.temperature = -1; }},
                          Case{"top_p must be in (0, 1], got 2", [](RequestSpec* s) { s->sampling.top_p = 2; }},
                          Case{"constraint: an empty json_schema",
                               [](RequestSpec* s) { s->constraint.kind = ConstraintSpec::Kind::kJsonSchema; }},
                          Case{"ignore_eos: cannot be set with structured output", [](RequestSpec* s) {
                                 s->constraint = {ConstraintSpec::Kind::kJsonObject, "", {}, "response_format"};
                                 s->ignore_eos = true;
                               }}}) {
      RequestSpec spec;
      spec.max_tokens = 4;
      c.set(&spec);
      auto bad = Normalize(r.surface, &spec, Ids(5));
      ASSERT_FALSE(bad.ok()) << c.field;
      EXPECT_EQ(std::string(bad.status().message()).rfind(Prefixed(r, c.field), 0), 0u) << bad.status();
    }
  }
  // Stop strings need a tokenizer to be matched.
  RequestContext no_tokenizer = Context();
  no_tokenizer.has_tokenizer = false;
  RequestSpec stop;
  stop.max_tokens = 4;
  stop.stop_strings = {"end"};
  EXPECT_EQ(FieldOf(Normalize(Surface::kEngine, &stop, Ids(5), no_tokenizer).status()), "stop");
}

TEST(RequestBoundaryTest, SeedByRow) {
  for (const SurfaceRules& r : SurfaceTable()) {
    SCOPED_TRACE(r.name);
    RequestSpec given = SpecDefaults(r.surface);
    given.max_tokens = 4;
    given.seed = 42;
    ASSERT_TRUE(Normalize(r.surface, &given, Ids(5)).ok());
    RequestSpec absent = SpecDefaults(r.surface, [] {
      SamplingParams p;
      p.seed = 9;  // --seed
      return p;
    }());
    absent.max_tokens = 4;
    ASSERT_TRUE(Normalize(r.surface, &absent, Ids(5)).ok());
    if (r.seed_default == SeedDefault::kConfigured) {
      EXPECT_EQ(given.sampling.seed, 42u);  // resolved at once
      EXPECT_FALSE(given.seed.has_value());
      EXPECT_FALSE(absent.seed.has_value());
      if (!r.temperature.has_value()) {
        EXPECT_EQ(absent.sampling.seed, 9u);  // the configuration's
      }
    } else {
      EXPECT_EQ(given.seed, 42u);  // the serving core resolves it when the id is known
      ResolveSeed(&absent, 1234);
      EXPECT_EQ(absent.sampling.seed, 1234u);
      ResolveSeed(&given, 1234);
      EXPECT_EQ(given.sampling.seed, 42u);
    }
  }
  // The engine takes only resolved seeds.
  RequestSpec unresolved;
  unresolved.max_tokens = 4;
  unresolved.seed = 3;
  const absl::Status st = CheckRequest(Surface::kEngine, Context(), Ids(5), unresolved);
  EXPECT_EQ(FieldOf(st), "seed") << st;
  // A normalized request's prompt is its token ids.
  RequestSpec four;
  four.max_tokens = 4;
  const absl::Status outside = CheckRequest(Surface::kEngine, Context(), {1, kVocab}, four);
  EXPECT_EQ(FieldOf(outside), "prompt[1]") << outside;
  EXPECT_NE(outside.message().find("token id 300"), std::string::npos) << outside;
}

TEST(RequestBoundaryTest, TemperatureByRow) {
  SamplingParams configured;
  configured.temperature = 0.7f;
  configured.top_k = 5;
  for (const SurfaceRules& r : SurfaceTable()) {
    SCOPED_TRACE(r.name);
    const RequestSpec spec = SpecDefaults(r.surface, configured);
    if (r.temperature.has_value()) {
      EXPECT_EQ(spec.sampling.temperature, *r.temperature);
      EXPECT_EQ(spec.sampling.top_k, 0);
    } else {
      EXPECT_EQ(spec.sampling.temperature, 0.7f);
      EXPECT_EQ(spec.sampling.top_k, 5);
    }
  }
  EXPECT_EQ(SpecDefaults(Surface::kCompletions).sampling.temperature, 1.0f);  // OpenAI's
  EXPECT_EQ(SpecDefaults(Surface::kChat).sampling.temperature, 1.0f);
}

TEST(RequestBoundaryTest, Prompts) {
  RequestSpec spec;
  spec.max_tokens = 4;
  PromptInput none;
  EXPECT_EQ(FieldOf(NormalizeRequest(Surface::kGrpc, Context(), none, &spec).status()), "prompt");
  const std::vector<TokenId> ids = {1, 2};
  PromptInput both;
  both.text = "hi";
  both.ids = ids;
  EXPECT_EQ(FieldOf(NormalizeRequest(Surface::kGrpc, Context(), both, &spec).status()), "prompt and prompt_token_ids");
  const std::vector<TokenId> outside = {1, kVocab};
  PromptInput bad_ids;
  bad_ids.ids = outside;
  const absl::Status st = NormalizeRequest(Surface::kGrpc, Context(), bad_ids, &spec).status();
  EXPECT_EQ(FieldOf(st), "prompt_token_ids[1]") << st;  // no `sampling.`: the prompt is not in that message
  // Text: encoded with BOS unless templated; a byte bound before encoding; room in the context.
  PromptInput text;
  text.text = "abc";
  auto encoded = NormalizeRequest(Surface::kCompletions, Context(), text, &spec);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_EQ(*encoded, (std::vector<TokenId>{1, 2 + 'a', 2 + 'b', 2 + 'c'}));
  text.templated = true;
  EXPECT_EQ(NormalizeRequest(Surface::kCompletions, Context(), text, &spec)->size(), 3u);
  RequestContext bytes = Context();
  bytes.max_prompt_bytes = 2;
  EXPECT_NE(NormalizeRequest(Surface::kCompletions, bytes, text, &spec).status().message().find("cannot fit the context"),
            std::string::npos);
  PromptInput nothing;
  nothing.text = "";
  nothing.templated = true;
  EXPECT_NE(NormalizeRequest(Surface::kPromptsFile, Context(), nothing, &spec).status().message().find("no tokens"),
            std::string::npos);
  for (int32_t len : {kContext, kContext + 5}) {
    const absl::Status full = Normalize(Surface::kOnePrompt, &spec, Ids(len)).status();
    EXPECT_EQ(FieldOf(full), "prompt_token_ids");
    EXPECT_NE(full.message().find("leave no room"), std::string::npos) << full;
    // The CLI's long prompt says it is longer than the context (tests/CMakeLists.txt: prompt_too_long).
    EXPECT_EQ(full.message().find("longer than the context of 64 tokens") != std::string::npos, len > kContext);
  }
}

// One row per finish reason; OpenAI's names are its three, and gRPC's are specula.v1.FinishReason's
// values (tests/serving/request_parse_test.cc parses them with the protobuf enum).
TEST(FinishNamesTest, EveryReasonHasEachSurfacesName) {
  const std::vector<FinishReason> all = {FinishReason::kNone,      FinishReason::kStopToken, FinishReason::kStopString,
                                         FinishReason::kMaxTokens, FinishReason::kAborted,   FinishReason::kError};
  std::set<std::string> internal;
  for (FinishReason f : all) {
    EXPECT_EQ(FinishNamesOf(f).reason, f);
    internal.insert(FinishName(f));
    const std::string openai = OpenAiFinishName(f);
    EXPECT_TRUE(openai == "stop" || openai == "length" || openai == "abort") << openai;
    EXPECT_EQ(std::string(GrpcFinishName(f)).rfind("FINISH_REASON_", 0), 0u);
  }
  EXPECT_EQ(internal.size(), all.size());  // the CLI tells every reason apart
  EXPECT_EQ(std::string(FinishName(FinishReason::kStopString)), "stop_string");
  EXPECT_EQ(std::string(OpenAiFinishName(FinishReason::kStopString)), "stop");
  EXPECT_EQ(std::string(OpenAiFinishName(FinishReason::kMaxTokens)), "length");
  EXPECT_EQ(std::string(GrpcFinishName(FinishReason::kAborted)), "FINISH_REASON_ABORTED");
  EXPECT_EQ(std::string(GrpcFinishName(FinishReason::kError)), "FINISH_REASON_UNSPECIFIED");
}

// The table as docs/architecture.md carries it and --help prints it.
TEST(RequestBoundaryTest, TheDocsCarryTheTable) {
  const std::string table = SurfaceTableMarkdown();
  for (const SurfaceRules& r : SurfaceTable()) {
    EXPECT_NE(table.find(std::string("| `") + r.name + "` |"), std::string::npos) << r.name;
  }
  std::ifstream doc(std::string(SPECULA_SOURCE_DIR) + "/docs/architecture.md");
  ASSERT_TRUE(doc.good());
  std::stringstream text;
  text << doc.rdbuf();
  EXPECT_NE(text.str().find(table), std::string::npos)
      << "docs/architecture.md's table of request defaults differs from the code's; it is:\n"
      << table;
}

}  // namespace
}  // namespace specula

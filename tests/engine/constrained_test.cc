// Structured output in the engine, on the real stories260K model (which knows nothing of JSON): the
// mask makes every constrained output follow its constraint and end by it, leaves the other rows of
// the batch untouched (their tokens equal each prompt's alone), and gives the same tokens batched,
// preempted or alone. Where the engine cannot constrain, it refuses by name. Composed with
// speculation (every proposer, the grammar's forced drafts, auto, the backend's verification), greedy
// outputs equal the plain constrained ones token for token.
#include <map>
#include <regex>
#include <tuple>

#include "draft/draft_model_proposer.h"
#include "draft/ngram_proposer.h"
#include "draft/suffix_proposer.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "nlohmann/json.hpp"
#include "tests/one_sequence.h"
#include "tests/test_util.h"
#include "tests/tiny_stories.h"

namespace specula {
namespace {

using Kind = ConstraintSpec::Kind;

constexpr const char* kSchema = R"({"type": "object", "properties": {
  "mood": {"enum": ["happy", "sad"]}, "age": {"type": "integer", "minimum": 1, "maximum": 99},
  "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "minItems": 1, "maxItems": 3}},
  "required": ["mood", "age", "pets"]})";
constexpr const char* kPhone = "[0-9]{3}-[0-9]{4}";

class ConstrainedEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::tie(model_, tok_) = testing::TinyStoriesTarget();
    ASSERT_NE(model_, nullptr);
    ASSERT_NE(tok_, nullptr);
  }

  SchedulerConfig Config(int32_t num_blocks) const {
    SchedulerConfig c;
    c.max_num_seqs = 32;
    c.max_num_batched_tokens = 128;
    c.block_size = 16;
    c.num_blocks = num_blocks;
    c.max_model_len = model_->config().max_seq_len;
    return c;
  }

  // Request i: every third plain (ignore_eos, fixed length), the others constrained by a schema, a
  // regex or a choice in turn; greedy and sampled alternately.
  std::vector<Request> Requests(int32_t n) const {
    const std::vector<std::string> who = {"Lily", "Tom", "The little dog", "A big bird", "Sue and Ben"};
    std::vector<Request> out;
    for (int32_t i = 0; i < n; ++i) {
      Request r;
      r.id = i;
      r.prompt = tok_->Encode(who[i % who.size()] + " went to the park and", true);
      r.max_tokens = 160;
      r.sampling.temperature = i % 2 == 0 ? 0.0f : 1.0f;
      r.sampling.seed = 100 + i;
      switch (i % 6) {
        case 0: case 3: r.ignore_eos = true; r.max_tokens = 12 + i; break;
        case 1: case 4: r.constraint = {Kind::kJsonSchema, kSchema, {}, "json_schema"}; break;
        case 2: r.constraint = {Kind::kRegex, kPhone, {}, "regex"}; break;
        case 5: r.constraint = {Kind::kChoice, "", {"once upon a time", "the end", "yes"}, "choice"}; break;
      }
      out.push_back(std::move(r));
    }
    return out;
  }

  std::map<RequestId, RequestOutput> RunAll(Engine& e, const std::vector<Request>& reqs) {
    for (const Request& r : reqs) EXPECT_TRUE(e.AddRequest(r).ok()) << r.id;
    std::map<RequestId, RequestOutput> out;
    for (int steps = 0; e.HasUnfinished(); ++steps) {
      EXPECT_LT(steps, 100000);
      for (RequestDelta& d : e.Step()) {
        if (d.finished) out.emplace(d.id, std::move(d.final));
      }
    }
    EXPECT_EQ(e.scheduler().blocks().num_available(), e.scheduler().blocks().num_blocks());
    return out;
  }

  void ExpectFollows(const Request& r, const RequestOutput& o) {
    SCOPED_TRACE(::testing::Message() << "request " << r.id << ": " << o.text);
    EXPECT_EQ(o.finish, FinishReason::kStopToken);  // ended by its grammar, with the stop token it forced
    switch (r.constraint.kind) {
      case Kind::kJsonSchema: {
        nlohmann::json j = nlohmann::json::parse(o.text, nullptr, false);
        ASSERT_TRUE(j.is_object());
        EXPECT_TRUE(j["mood"] == "happy" || j["mood"] == "sad");
        ASSERT_TRUE(j["age"].is_number_integer());
        EXPECT_GE(j["age"].get<int>(), 1);
        EXPECT_LE(j["age"].get<int>(), 99);
        ASSERT_TRUE(j["pets"].is_array());
        EXPECT_GE(j["pets"].size(), 1u);
        EXPECT_LE(j["pets"].size(), 3u);
        break;
      }
      case Kind::kRegex: EXPECT_TRUE(std::regex_match(o.text, std::regex(kPhone))); break;
      case Kind::kChoice:
        EXPECT_TRUE(o.text == "once upon a time" || o.text == "the end" || o.text == "yes");
        break;
      default: break;
    }
  }

  LlamaModel* model_ = nullptr;
  Tokenizer* tok_ = nullptr;
};

TEST_F(ConstrainedEngineTest, EveryOutputFollowsItsConstraintAndPlainRowsAreUntouched) {
  const std::vector<Request> reqs = Requests(24);
  Engine e(model_, tok_, Config(256));
  auto got = RunAll(e, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  for (const Request& r : reqs) {
    if (r.constraint.active()) {
      ExpectFollows(r, got[r.id]);
      continue;
    }
    GenerateOptions opt;
    opt.max_tokens = r.max_tokens;
    opt.sampling = r.sampling;
    auto alone = Generate(*model_, r.prompt, opt);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(got[r.id].tokens, alone->tokens) << "plain request " << r.id << " changed beside constrained rows";
  }
  EXPECT_GT(e.stats().constrained_rows, 0);
}

// Without drafts, every token takes one draw of its request's sampler, so sampled requests too give
// the same tokens whatever the schedule. (A verification takes its draws from the request's
// verification stream: with drafts, sampled output follows the same distribution, and greedy output
// is the same, as the tests below check.)
TEST_F(ConstrainedEngineTest, BatchedPreemptedAndAloneGiveTheSameTokens) {
  const std::vector<Request> reqs = Requests(18);
  SpecConfig no_drafts;
  no_drafts.grammar_drafts = 0;
  Engine batched(model_, tok_, Config(256), no_drafts);
  auto all = RunAll(batched, reqs);
  Engine small(model_, tok_, Config(24), no_drafts);  // too few blocks: sequences are preempted
  auto preempted = RunAll(small, reqs);
  int64_t preemptions = 0;
  for (const Request& r : reqs) {
    preemptions += preempted[r.id].num_preemptions;
    EXPECT_EQ(preempted[r.id].tokens, all[r.id].tokens) << "request " << r.id;
    if (!r.constraint.active()) continue;
    Engine alone(model_, tok_, Config(64), no_drafts);
    auto one = RunAll(alone, {r});
    EXPECT_EQ(one[r.id].tokens, all[r.id].tokens) << "request " << r.id;
  }
  EXPECT_GT(preemptions, 0);
}

TEST_F(ConstrainedEngineTest, RefusedByNameWhereItCannotConstrain) {
  Request r = Requests(2)[1];
  Engine no_tokenizer(model_, nullptr, Config(64));
  auto st = no_tokenizer.AddRequest(r);
  EXPECT_NE(st.message().find("json_schema: structured output needs the model's tokenizer"), std::string::npos) << st;
  Engine e(model_, tok_, Config(64));
  Request bad = r;
  bad.constraint = {Kind::kGrammar, "root ::= (", {}, "guided_grammar"};
  st = e.AddRequest(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("guided_grammar: "), std::string::npos) << st;
  Request eos = r;
  eos.ignore_eos = true;
  st = e.AddRequest(eos);
  EXPECT_NE(st.message().find("ignore_eos"), std::string::npos) << st;
  EXPECT_FALSE(e.HasUnfinished());
  // A rule's own sampling temperature: not applied by the engine, so refused by name.
  Request hot = r;
  hot.constraint = {Kind::kGrammar, "root ::= a\na[temperature=0.5] ::= \"x\"\n", {}, "guided_grammar"};
  st = e.AddRequest(hot);
  EXPECT_NE(st.message().find("guided_grammar: the rule at byte 11 sets a sampling temperature"), std::string::npos)
      << st;
}

// Greedy constrained requests (schemas, a regex, choices) and greedy plain ones beside them.
std::vector<Request> GreedyOnly(std::vector<Request> reqs) {
  for (Request& r : reqs) r.sampling.temperature = 0.0f;
  return reqs;
}

TEST_F(ConstrainedEngineTest, SpeculationUnderAGrammarEqualsPlainConstrainedGreedy) {
  const std::vector<Request> reqs = GreedyOnly(Requests(18));
  SpecConfig plain_spec;
  plain_spec.grammar_drafts = 0;
  Engine plain(model_, tok_, Config(256), plain_spec);
  auto want = RunAll(plain, reqs);
  EXPECT_EQ(plain.stats().spec.drafts, 0);
  auto draft_weights = LoadModel(testing::TinyStoriesDir() + "/stories260K-draft.bin");
  ASSERT_TRUE(draft_weights.ok()) << draft_weights.status();
  LlamaModel draft(std::move(draft_weights).value(), MakeCpuBackend());
  NgramProposer ngram(1, 3);
  SuffixProposer suffix(SuffixParams{}, 1 << 16);
  DraftModelProposer draft_proposer(&draft, 16, 4096);
  // Forced drafts fill the slots of a step where the proposer has none: n-gram lookups often miss,
  // a draft model drafts under the grammar every step.
  enum class Forced { kNone, kSome, kAny };
  struct Case {
    const char* name;
    Proposer* proposer;
    int32_t k, grammar_drafts, num_blocks;
    Forced forced;
    SpecConfig::VerifyOn verify_on = SpecConfig::VerifyOn::kAuto;
  };
  const Case cases[] = {
      {"forced drafts alone", nullptr, 0, 8, 256, Forced::kSome},
      {"n-gram, no forced drafts", &ngram, 3, 0, 256, Forced::kNone},
      {"n-gram and forced drafts", &ngram, 3, 8, 256, Forced::kSome},
      {"suffix and forced drafts", &suffix, 4, 8, 256, Forced::kAny},
      {"draft model and forced drafts", &draft_proposer, 3, 4, 256, Forced::kNone},
      {"draft model, preempted", &draft_proposer, 3, 8, 28, Forced::kNone},
      {"suffix, verified by the backend", &suffix, 4, 8, 256, Forced::kAny, SpecConfig::VerifyOn::kBackend},
      {"forced drafts, verified by the backend, preempted", nullptr, 0, 8, 28, Forced::kSome,
       SpecConfig::VerifyOn::kBackend},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SchedulerConfig config = Config(c.num_blocks);
    config.num_spec_tokens = c.k;
    SpecConfig spec{c.proposer};
    spec.grammar_drafts = c.grammar_drafts;
    spec.verify_on = c.verify_on;
    Engine e(model_, tok_, config, spec);
    auto got = RunAll(e, reqs);
    int64_t preemptions = 0;
    for (const Request& r : reqs) {
      EXPECT_EQ(got[r.id].tokens, want[r.id].tokens) << "request " << r.id;
      preemptions += got[r.id].num_preemptions;
    }
    const SpecStats& st = e.stats().spec;
    EXPECT_GT(st.accepted_tokens, 0);
    if (c.forced != Forced::kAny) EXPECT_EQ(st.forced_tokens > 0, c.forced == Forced::kSome) << st.forced_tokens;
    EXPECT_LE(st.forced_accepted, st.forced_tokens);
    if (c.num_blocks < 64) EXPECT_GT(preemptions, 0);
    EXPECT_EQ(draft_proposer.blocks_in_use(), 0);
  }
}

// A proposer that knows nothing of JSON drafts tokens the grammar refuses: they are cut before the
// forward, never verified, and counted.
TEST_F(ConstrainedEngineTest, DraftsThatLeaveTheGrammarAreCutAndCounted) {
  Request r = GreedyOnly(Requests(2))[1];
  r.prompt = tok_->Encode("Lily and Lily and Lily and Lily and Lily and", true);
  SchedulerConfig config = Config(64);
  config.num_spec_tokens = 4;
  NgramProposer ngram(1, 3);  // drafts "Lily and" from the prompt, which no schema allows
  SpecConfig spec{&ngram};
  spec.grammar_drafts = 0;
  Engine e(model_, tok_, config, spec);
  auto got = RunAll(e, {r});
  ExpectFollows(r, got[r.id]);
  EXPECT_GT(e.stats().spec.cut_tokens, 0);
  EXPECT_EQ(got[r.id].spec.cut_tokens, e.stats().spec.cut_tokens);
  EXPECT_EQ(e.stats().spec.forced_tokens, 0);
}

// The grammar's forced continuation reserves draft slots without a proposer, and a schema's keys
// and punctuation are most of what it drafts: a request needs fewer steps than its tokens.
TEST_F(ConstrainedEngineTest, ForcedDraftsNeedNoProposer) {
  Request r = GreedyOnly(Requests(2))[1];
  for (bool compact : {false, true}) {
    SCOPED_TRACE(compact ? "compact JSON" : "any whitespace");
    r.constraint.compact_json = compact;
    Engine e(model_, tok_, Config(64));
    auto got = RunAll(e, {r});
    ExpectFollows(r, got[r.id]);
    const RequestOutput& o = got[r.id];
    EXPECT_GT(o.spec.forced_accepted, 0);
    EXPECT_EQ(o.spec.forced_tokens, o.spec.draft_tokens);  // no proposer: every draft was forced
    EXPECT_LT(e.stats().steps, static_cast<int64_t>(o.tokens.size()));
    if (compact) EXPECT_EQ(o.text.find(": "), o.text.find(':'));  // ", " and ": " exactly
  }
}

}  // namespace
}  // namespace specula

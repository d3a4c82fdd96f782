// Structured output in the engine, on the real stories260K model (which knows nothing of JSON): the
// mask makes every constrained output follow its constraint and end by it, leaves the other rows of
// the batch untouched (their tokens equal each prompt's alone), and gives the same tokens batched,
// preempted or alone. Where the engine cannot constrain, it refuses by name.
#include <map>
#include <regex>
#include <tuple>

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

TEST_F(ConstrainedEngineTest, BatchedPreemptedAndAloneGiveTheSameTokens) {
  const std::vector<Request> reqs = Requests(18);
  Engine batched(model_, tok_, Config(256));
  auto all = RunAll(batched, reqs);
  Engine small(model_, tok_, Config(24));  // too few blocks: sequences are preempted
  auto preempted = RunAll(small, reqs);
  int64_t preemptions = 0;
  for (const Request& r : reqs) {
    preemptions += preempted[r.id].num_preemptions;
    EXPECT_EQ(preempted[r.id].tokens, all[r.id].tokens) << "request " << r.id;
    if (!r.constraint.active()) continue;
    Engine alone(model_, tok_, Config(64));
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
  // Logits kept where the backend chooses (a GPU's way, which the CPU backend can take too): the
  // mask runs on host logits, so the request is refused naming the backend.
  SpecConfig on_backend;
  on_backend.verify_on = SpecConfig::VerifyOn::kBackend;
  Engine device(model_, tok_, Config(64), on_backend);
  st = device.AddRequest(r);
  EXPECT_NE(st.message().find("json_schema: structured output is not supported on the cpu backend yet"),
            std::string::npos) << st;
}

}  // namespace
}  // namespace specula

// The compiler and matchers over xgrammar on the TinyStories tokenizer (SentencePiece with byte
// pieces): the vocabulary's bytes out of context, the mask's bits and their application, walking a
// valid document token by token to its forced stop token, rollback, the cache, and compiling from
// several threads at once.
#include "constrain/constraint.h"
#include "constrain/forced_spellings.h"

#include <cmath>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

using Kind = ConstraintSpec::Kind;

class CompilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = LoadTokenizer(testing::TinyStoriesDir() + "/tok512.bin", 512);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(tok).value();
    compiler_ = ConstraintCompiler::Create(MakeConstraintVocab(*tok_, 512, tok_->eos_ids()));
  }

  bool Allowed(const std::vector<uint32_t>& mask, TokenId t) const { return (mask[t / 32] >> (t % 32)) & 1u; }

  // `text` as the model could generate it mid-sequence: at each point the longest token whose bytes
  // come next (Encode would add SentencePiece's dummy-prefix space at the start).
  std::vector<TokenId> Tokens(const std::string& text) const {
    std::vector<TokenId> out;
    for (size_t at = 0; at < text.size();) {
      TokenId best = -1;
      size_t best_len = 0;
      for (TokenId id = 0; id < tok_->vocab_size(); ++id) {
        const std::string b = tok_->TokenBytes(id);
        if (b.size() > best_len && text.compare(at, b.size(), b) == 0) best = id, best_len = b.size();
      }
      EXPECT_GE(best, 0) << "no token for byte " << at;
      if (best < 0) break;
      out.push_back(best);
      at += best_len;
    }
    return out;
  }

  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<ConstraintCompiler> compiler_;
};

TEST_F(CompilerTest, VocabularyBytesKeepTheLeadingSpaceOutOfContext) {
  ConstraintVocab v = MakeConstraintVocab(*tok_, 520, tok_->eos_ids());
  EXPECT_EQ(v.kind, VocabKind::kByteFallback);
  ASSERT_EQ(v.token_bytes.size(), 520u);  // the model's rows past the tokenizer's are empty
  EXPECT_TRUE(v.token_bytes[515].empty());
  const std::vector<TokenId> ids = tok_->Encode("the dog", false);
  ASSERT_GE(ids.size(), 2u);
  std::string joined;
  for (TokenId id : ids) joined += v.token_bytes[id];
  EXPECT_EQ(joined, " the dog");  // SentencePiece's dummy prefix, kept out of context
  for (TokenId eos : tok_->eos_ids()) EXPECT_TRUE(v.token_bytes[eos].empty());
}

TEST_F(CompilerTest, ApplyMaskSetsExactlyTheClearedBitsToMinusInfinity) {
  const int32_t vocab = 77;  // not a multiple of 32
  std::vector<uint32_t> mask(MaskWords(vocab));
  ASSERT_EQ(mask.size(), 3u);
  std::mt19937 rng(1);
  for (uint32_t& w : mask) w = rng();
  mask[1] = ~0u;
  std::vector<float> logits(vocab);
  for (int32_t v = 0; v < vocab; ++v) logits[v] = static_cast<float>(v) * 0.5f;
  ApplyMask(mask, absl::MakeSpan(logits));
  for (int32_t v = 0; v < vocab; ++v) {
    if (Allowed(mask, v)) {
      EXPECT_EQ(logits[v], static_cast<float>(v) * 0.5f) << v;
    } else {
      EXPECT_TRUE(std::isinf(logits[v]) && logits[v] < 0) << v;
    }
  }
}

TEST_F(CompilerTest, AValidDocumentWalksToItsForcedStopToken) {
  auto compiled = compiler_->Compile(
      {Kind::kJsonSchema, R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})", {}, "s"});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ConstraintMatcher m(*compiled, tok_->eos_ids());
  std::vector<uint32_t> mask(MaskWords(compiler_->vocab_size()));
  for (TokenId t : Tokens(R"({"n": 42})")) {
    m.FillMask(absl::MakeSpan(mask));
    EXPECT_TRUE(Allowed(mask, t)) << t;
    ASSERT_TRUE(m.Accept(t)) << t;
  }
  m.FillMask(absl::MakeSpan(mask));
  int32_t allowed = 0;
  for (TokenId t = 0; t < compiler_->vocab_size(); ++t) allowed += Allowed(mask, t) ? 1 : 0;
  EXPECT_EQ(allowed, static_cast<int32_t>(tok_->eos_ids().size()));  // only the stop set
  EXPECT_FALSE(m.terminated());
  EXPECT_FALSE(m.Accept(Tokens("x")[0]));  // refused, and the matcher unchanged
  ASSERT_TRUE(m.Accept(tok_->eos_ids()[0]));
  EXPECT_TRUE(m.terminated());
}

TEST_F(CompilerTest, RollbackRestoresTheEarlierMask) {
  auto compiled = compiler_->Compile({Kind::kRegex, "(ab|cd)+e", {}, "r"});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ConstraintMatcher m(*compiled, tok_->eos_ids());
  const int32_t words = MaskWords(compiler_->vocab_size());
  std::vector<uint32_t> first(words), again(words);
  const std::vector<TokenId> ids = Tokens("abcdab");
  ASSERT_GE(ids.size(), 2u);
  ASSERT_TRUE(m.Accept(ids[0]));
  m.FillMask(absl::MakeSpan(first));
  for (size_t i = 1; i < ids.size(); ++i) ASSERT_TRUE(m.Accept(ids[i]));
  m.Rollback(static_cast<int32_t>(ids.size()) - 1);
  m.FillMask(absl::MakeSpan(again));
  EXPECT_EQ(first, again);
}

// The one continuation a grammar allows, as tokens to draft: with compact JSON the opening brace,
// a required key and its separator are all forced; with any whitespace only the key's rest is.
TEST_F(CompilerTest, ForcedTokensSpellTheOneAllowedContinuation) {
  const std::string schema =
      R"({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": false})";
  auto spell = [&](const std::vector<TokenId>& ids) {
    std::string s;
    for (TokenId id : ids) s += tok_->TokenBytes(id);
    return s;
  };
  ConstraintSpec compact{Kind::kJsonSchema, schema, {}, "json"};
  compact.compact_json = true;
  auto c = compiler_->Compile(compact);
  ASSERT_TRUE(c.ok()) << c.status();
  ConstraintMatcher m(*c, tok_->eos_ids());
  const std::vector<TokenId> start = m.ForcedTokens(64);
  // The last token may be held back where a longer one could follow ('"' before a string's text).
  const std::string forced = spell(start);
  EXPECT_EQ(std::string(R"({"answer": ")").rfind(forced, 0), 0u) << forced;
  EXPECT_GE(forced.size(), std::string(R"({"answer":)").size()) << forced;
  EXPECT_EQ(m.ForcedTokens(2).size(), std::min<size_t>(2, start.size()));
  for (TokenId t : start) ASSERT_TRUE(m.Accept(t));  // drafts the matcher takes as they are
  for (TokenId t : Tokens(std::string(R"({"answer": "yes"})").substr(forced.size()))) ASSERT_TRUE(m.Accept(t));
  EXPECT_TRUE(m.ForcedTokens(64).empty());  // complete: the stop token may come, or nothing else
  ConstraintMatcher loose(*compiler_->Compile({Kind::kJsonSchema, schema, {}, "json"}), tok_->eos_ids());
  EXPECT_EQ(spell(loose.ForcedTokens(64)), "{");  // then a blank or '"'
  for (TokenId t : Tokens("{\"")) ASSERT_TRUE(loose.Accept(t));
  EXPECT_EQ(spell(loose.ForcedTokens(64)), "answer\"");
  EXPECT_TRUE(loose.ForcedTokens(0).empty());
}

// Where the model split a forced string otherwise, later forced drafts of that string follow it: a
// remembered token where it spells what comes, the grammar's split where one of its tokens starts,
// and an end where neither does (the engine asks the grammar to split the rest afresh).
TEST_F(CompilerTest, ForcedSpellingsFollowTheModelsSplit) {
  auto spell = [&](const std::vector<TokenId>& ids) {
    std::string s;
    for (TokenId id : ids) s += tok_->TokenBytes(id);
    return s;
  };
  const std::vector<TokenId> forced = Tokens(" the dog");
  ASSERT_EQ(spell(forced), " the dog");
  ASSERT_GE(forced.size(), 2u);
  const std::vector<TokenId> short_t = Tokens(" t"), cat = Tokens(" cat");
  ASSERT_EQ(short_t.size(), 1u);
  ForcedSpellings spellings(tok_.get(), 2);
  EXPECT_EQ(spellings.Spell(forced), forced);  // nothing learned: the grammar's split
  spellings.Learn(forced, 0, cat[0]);          // not a split of " the dog": ignored
  EXPECT_EQ(spellings.size(), 0u);
  spellings.Learn(forced, 0, short_t[0]);
  EXPECT_EQ(spellings.Spell(forced), short_t);  // " t", then "he dog" starts inside " the": the end
  // The split's own choice where " dog" starts: remembered all the same.
  size_t at = 0;
  while (at < forced.size() && spell(std::vector<TokenId>(forced.begin() + at, forced.end())) != " dog") ++at;
  ASSERT_LT(at, forced.size());
  spellings.Learn(forced, at, forced[at]);
  EXPECT_EQ(spellings.size(), 2u);
  const std::vector<TokenId> tail(forced.begin() + at, forced.end());
  EXPECT_EQ(spellings.Spell(tail), tail);
  spellings.Learn(Tokens(" the cat"), 1, cat[0]);  // a third entry: the bounded table starts over
  EXPECT_EQ(spellings.size(), 1u);
  EXPECT_EQ(spellings.Spell(forced), forced);
  ForcedSpellings without(nullptr);
  without.Learn(forced, 0, short_t[0]);
  EXPECT_EQ(without.Spell(forced), forced);
}

TEST_F(CompilerTest, ARepeatedConstraintComesFromTheCache) {
  const ConstraintSpec spec{Kind::kJsonSchema, R"({"type":"array","items":{"type":"boolean"},"maxItems":4})", {}, "s"};
  ASSERT_TRUE(compiler_->Compile(spec).ok());
  const int64_t after_first = compiler_->cache_bytes();
  EXPECT_GT(after_first, 0);
  ASSERT_TRUE(compiler_->Compile(spec).ok());
  EXPECT_EQ(compiler_->cache_bytes(), after_first);
}

TEST_F(CompilerTest, ErrorsNameTheFieldAndCompilingFromManyThreadsIsSafe) {
  auto bad = compiler_->Compile({Kind::kGrammar, "root ::= (", {}, "guided_grammar"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message().rfind("guided_grammar: ", 0), 0u) << bad.status();
  auto bad_regex = compiler_->Compile({Kind::kRegex, "(a", {}, "constraint.regex"});
  EXPECT_EQ(bad_regex.status().message().rfind("constraint.regex: ", 0), 0u) << bad_regex.status();
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < 3; ++j) {
        const std::string schema = R"({"type":"object","properties":{"k)" + std::to_string(i * 10 + j) +
                                   R"(":{"type":"integer","minimum":0,"maximum":9}}})";
        ok[i] += compiler_->Compile({Kind::kJsonSchema, schema, {}, "s"}).ok() ? 1 : 0;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ok[i], 3) << "thread " << i;
}

}  // namespace
}  // namespace specula

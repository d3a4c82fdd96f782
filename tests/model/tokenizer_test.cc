// Tokenizers: ids equal the HF `tokenizers` reference (tests/data/make_tokenizer_data.py) and
// encode/decode round-trips on ASCII, Chinese, emoji and invalid UTF-8.
#include <fstream>

#include "core/mapped_file.h"
#include "model/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace specula {
namespace {

using json = nlohmann::json;
using namespace std::string_literals;

std::string TokenizerPath(const std::string& name) {
  if (name == "tok512") return testing::TinyStoriesDir() + "/tok512.bin";
  return testing::TestDataDir() + "/tokenizers/" + name + "/tokenizer.json";
}

std::unique_ptr<Tokenizer> Load(const std::string& name) {
  auto t = LoadTokenizer(TokenizerPath(name), 512);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

class TokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerTest, IdsEqualReferenceTokenizer) {
  auto tok = Load(GetParam());
  ASSERT_NE(tok, nullptr);
  auto text = ReadTextFile(testing::TestDataDir() + "/tokenizers/reference_ids.json");
  ASSERT_TRUE(text.ok());
  const json ref = json::parse(*text);
  ASSERT_TRUE(ref.contains(GetParam()));
  int checked = 0;
  for (const auto& [key, add_bos] : {std::pair{GetParam(), false}, {GetParam() + "+bos", true}}) {
    for (const auto& e : ref[key]) {
      const std::string s = e["text"];
      EXPECT_EQ(tok->Encode(s, add_bos), e["ids"].get<std::vector<TokenId>>())
          << GetParam() << (add_bos ? " +bos" : "") << " on \"" << s << "\"";
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
}

TEST_P(TokenizerTest, RoundTrips) {
  auto tok = Load(GetParam());
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string> cases = {
      "Hello, world! The quick brown fox.",
      "  two leading spaces and trailing  ",
      "tabs\tand\nnewlines\r\n",
      "从前有一个小女孩，她叫莉莉。我们的第一批用户用中文写作。",
      "中文 mixed with English 和数字 2024",
      "emoji 😀🚀👩‍💻🇫🇷 end",
      "invalid \xff\xfe bytes \xc3( and a cut \xe4\xb8"s,
      "\x80\x80 lone continuation bytes \xf0\x9f"s,
  };
  for (const std::string& s : cases) {
    for (bool bos : {false, true}) {
      const auto ids = tok->Encode(s, bos);
      EXPECT_EQ(tok->Decode(ids), s) << GetParam() << " bos=" << bos;
      // Streaming decode, token by token, gives the same bytes.
      std::string streamed;
      TokenId prev = -1;
      for (TokenId id : ids) {
        streamed += tok->DecodeToken(prev, id);
        prev = id;
      }
      EXPECT_EQ(streamed, s);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenizerTest,
                         ::testing::Values("tok512", "llama3_style", "smollm_style", "llama2_style"));

TEST(TokenizerConfigTest, BosEosFromConfigAndTemplate) {
  auto l2 = Load("llama2_style");  // tokenizer_config.json: add_bos_token, <s>, </s>
  ASSERT_NE(l2, nullptr);
  EXPECT_TRUE(l2->add_bos_default());
  EXPECT_EQ(l2->bos_id(), 1);
  EXPECT_EQ(l2->eos_ids(), std::vector<TokenId>{2});
  auto l3 = Load("llama3_style");  // post_processor template adds <|begin_of_text|>
  ASSERT_NE(l3, nullptr);
  EXPECT_TRUE(l3->add_bos_default());
  EXPECT_EQ(l3->bos_id(), 0);
  EXPECT_EQ(l3->Encode("hi", true).front(), 0);
}

TEST(TokenizerErrorTest, UnsupportedTypeNamesTheField) {
  auto t = LoadTokenizer(testing::TestDataDir() + "/bad/wordpiece_tokenizer.json", 512);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("model.type"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("WordPiece"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("wordpiece_tokenizer.json"), std::string::npos);
}

TEST(TokenizerErrorTest, UnknownSplitRegexIsRefused) {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Isolated"}})";
  auto t = LoadTokenizer(dir + "/tokenizer.json", 1);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("pre_tokenizer.pattern"), std::string::npos) << t.status();
}

TEST(TokenizerErrorTest, MissingAndMismatchedFiles) {
  auto missing = LoadTokenizer("/nonexistent/tok.bin", 512);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/tok.bin"), std::string::npos);
  // tok512.bin read as a 1000-token vocabulary runs out of bytes.
  auto mismatch = LoadTokenizer(testing::TinyStoriesDir() + "/tok512.bin", 1000);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("tok512.bin"), std::string::npos) << mismatch.status();
  EXPECT_NE(mismatch.status().message().find("truncated"), std::string::npos) << mismatch.status();
}

}  // namespace
}  // namespace specula

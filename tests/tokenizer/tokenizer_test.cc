// Tokenizers: ids equal the HF `tokenizers` reference (tests/data/make_tokenizer_data.py) and
// encode/decode round-trips on ASCII, Chinese, emoji and invalid UTF-8.
#include <chrono>
#include <fstream>

#include "core/mapped_file.h"
#include "tokenizer/tokenizer.h"
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

// Found by review while writing fuzz/hf_tokenizer_fuzz, each reproduced with it: nlohmann's value()
// throws when a field has another type than its default, so each of these ended the process
// (std::terminate) instead of naming the field; and an id far past the entries grew the tables to it
// (10M ids: 320 MB) before the gap was found.
TEST(TokenizerErrorTest, FieldsOfTheWrongTypeNameTheField) {
  const std::string vocab = R"("vocab": {"a": 0, "b": 1, "ab": 2})";
  auto with = [&](const std::string& model_extra, const std::string& top_extra) {
    return R"({"model": {"type": "BPE", )" + vocab + model_extra + "}" + top_extra + "}";
  };
  struct Case { std::string json, mention; };
  const std::vector<Case> cases = {
      {R"({"model": 1})", "field 'model' must be an object"},
      {R"({"model": {"type": 1}})", "field 'model.type' must be a string"},
      {with(R"(, "merges": {"a": "b"})", ""), "field 'model.merges' must be a list"},
      {with(R"(, "byte_fallback": "yes")", ""), "field 'model.byte_fallback' must be true or false"},
      {with(R"(, "ignore_merges": 1)", ""), "field 'model.ignore_merges' must be true or false"},
      {with("", R"(, "added_tokens": {"x": 1})"), "field 'added_tokens' must be a list"},
      {with("", R"(, "added_tokens": [{"id": 3, "content": "<s>", "special": "yes"}])"),
       "field 'added_tokens[].special' must be true or false"},
      {with("", R"(, "normalizer": {"type": "Prepend", "prepend": 1})"), "field 'normalizer.prepend' must be a string"},
      {with("", R"(, "normalizer": {"type": "Replace", "pattern": {"String": 1}, "content": "x"})"),
       "field 'normalizer.pattern.String' must be a string"},
      {with("", R"(, "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": []})"),
       "field 'normalizer.content' must be a string"},
      {with("", R"(, "pre_tokenizer": {"type": "ByteLevel", "use_regex": "no"})"),
       "field 'pre_tokenizer.use_regex' must be true or false"},
      {with("", R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "add_prefix_space": 0}]})"),
       "field 'pre_tokenizer.pretokenizers[0].add_prefix_space' must be true or false"},
      {with("", R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": 5}})"), "pre_tokenizer.pattern"},
      {with("", R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\p{N}+"}, "behavior": 1})"),
       "field 'pre_tokenizer.behavior' must be a string"},
      {with("", R"(, "pre_tokenizer": {"type": "Digits", "individual_digits": "1"})"),
       "field 'pre_tokenizer.individual_digits' must be true or false"},
      {with("", R"(, "pre_tokenizer": {"type": "Metaspace", "replacement": 95})"),
       "field 'pre_tokenizer.replacement' must be a string"},
      {with("", R"(, "pre_tokenizer": {"type": "Metaspace", "prepend_scheme": false})"),
       "field 'pre_tokenizer.prepend_scheme' must be a string"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 9999999}}})", "has id 9999999, but model.vocab and added_tokens hold 1"},
  };
  const std::string dir = testing::MakeTempDir();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    std::ofstream(dir + "/tokenizer.json", std::ios::trunc) << c.json;
    auto t = LoadTokenizer(dir + "/tokenizer.json", 0);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(c.mention), std::string::npos) << t.status();
    EXPECT_NE(t.status().message().find(dir + "/tokenizer.json"), std::string::npos) << t.status();
  }
  // A post_processor whose SpecialToken is not an object is no BOS, not an error (nor a throw).
  std::ofstream(dir + "/tokenizer.json", std::ios::trunc)
      << with("", R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": 1}]})");
  auto t = LoadTokenizer(dir + "/tokenizer.json", 0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_id(), -1);
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

// Found by fuzz/llama2c_tokenizer_fuzz (out of memory): the vocab_size a model header gives was
// trusted for the tables before the file was read, so a 582-byte file with vocab_size 503316479 asked
// for 16 GB. The input, minimized by hand: a header and three tokens.
TEST(TokenizerErrorTest, VocabSizeTheFileCannotHoldIsRefusedBeforeAllocating) {
  std::string bytes;
  auto i32 = [&](int32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); };
  i32(7);  // max_token_length
  for (const std::string piece : {"<unk>", "<s>", "</s>"}) {
    i32(0);  // score 0.0f
    i32(static_cast<int32_t>(piece.size()));
    bytes += piece;
  }
  const std::string path = testing::MakeTempDir() + "/tok.bin";
  std::ofstream(path, std::ios::binary) << bytes;
  auto t = LoadTokenizer(path, 503316479);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("cannot hold the model's 503316479 tokens"), std::string::npos) << t.status();
  EXPECT_TRUE(LoadTokenizer(path, 3).ok());
}

// Found by fuzz/llama2c_tokenizer_fuzz (the target's check that Encode makes ids inside the
// vocabulary), minimized by libFuzzer to 16 bytes: vocab_size 1 and one empty token. Encode
// prepended BOS (id 1) to a 1-token vocabulary: an embedding row past the table.
TEST(TokenizerErrorTest, VocabularyWithoutTheFixedIdsIsRefused) {
  const unsigned char file[12] = {0x2c, 0, 0, 0, 0xd7, 0x06, 0x00, 0x1c, 0, 0, 0, 0};  // max_len 44; score, length 0
  const std::string path = testing::MakeTempDir() + "/tok1.bin";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(file), sizeof(file));
  auto t = LoadTokenizer(path, 1);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("vocab_size 1 cannot hold <unk>, <s> and </s>"), std::string::npos) << t.status();
}

// Found by the rate of fuzz/jsonl_request_fuzz: the llama2.c tokenizer rescanned every adjacent pair
// for each merge (quadratic), so a 4 KB prompt took seconds under ASan and a 1 MB one hours: a
// request could hold a server thread. A priority queue merges in O(n log n), to the same tokens
// (IdsEqualReferenceTokenizer above).
TEST(TokenizerTest, LongTextEncodesInLinearithmicTime) {
  auto tok = Load("tok512");
  ASSERT_NE(tok, nullptr);
  std::string text;
  while (text.size() < (256 << 10)) text += "Once upon a time, there was a little girl named Lily. She liked to play. ";
  const auto start = std::chrono::steady_clock::now();
  const std::vector<TokenId> ids = tok->Encode(text, true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(tok->Decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 2);  // merged, not left as characters
  EXPECT_LT(seconds, 20.0) << "256 KB took " << seconds << " s to encode";  // ~0.1 s; quadratic: hours
}

}  // namespace
}  // namespace specula

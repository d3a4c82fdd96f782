// The tokenizer embedded in a GGUF file: SmolLM2-135M-Instruct's (byte-level BPE, "smollm" split)
// from the real file, and small gpt2 / llama (sentencepiece) vocabularies written here, with each
// kind of bad tokenizer.ggml.* metadata refused by an error naming the key. The ids themselves are
// compared with HF tokenizers in python/test_gguf_tokenizer.py.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <variant>

#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specula {
namespace {

using namespace std::string_literals;

// GGUF metadata values this test writes.
using Value = std::variant<std::string, uint32_t, bool, std::vector<std::string>, std::vector<int32_t>,
                           std::vector<float>>;
using Metadata = std::map<std::string, Value>;

// A GGUF v3 file with `kv` and no tensors.
std::string WriteGguf(const Metadata& kv, const std::string& name) {
  std::string b;
  auto raw = [&](const void* p, size_t n) { b.append(static_cast<const char*>(p), n); };
  auto u32 = [&](uint32_t v) { raw(&v, 4); };
  auto u64 = [&](uint64_t v) { raw(&v, 8); };
  auto str = [&](const std::string& s) {
    u64(s.size());
    b += s;
  };
  b += "GGUF";
  u32(3);
  u64(0);  // tensors
  u64(kv.size());
  for (const auto& [key, value] : kv) {
    str(key);
    if (auto* s = std::get_if<std::string>(&value)) {
      u32(8);
      str(*s);
    } else if (auto* u = std::get_if<uint32_t>(&value)) {
      u32(4);
      u32(*u);
    } else if (auto* f = std::get_if<bool>(&value)) {
      u32(7);
      b += static_cast<char>(*f);
    } else if (auto* ss = std::get_if<std::vector<std::string>>(&value)) {
      u32(9);
      u32(8);
      u64(ss->size());
      for (const std::string& x : *ss) str(x);
    } else if (auto* is = std::get_if<std::vector<int32_t>>(&value)) {
      u32(9);
      u32(5);
      u64(is->size());
      raw(is->data(), is->size() * 4);
    } else if (auto* fs = std::get_if<std::vector<float>>(&value)) {
      u32(9);
      u32(6);
      u64(fs->size());
      raw(fs->data(), fs->size() * 4);
    }
  }
  static const std::string dir = testing::MakeTempDir();
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << b;
  return path;
}

// A byte-level vocabulary: the 256 byte symbols, "he" and "Ġhe" by two merges, and a control token.
Metadata TinyGpt2() {
  std::vector<std::string> tokens = ByteToUnicode();
  tokens.insert(tokens.end(), {"he", "\xC4\xA0he", "<|im_end|>"});  // "Ġhe"
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;
  return {{"tokenizer.ggml.model", "gpt2"s},
          {"tokenizer.ggml.pre", "gpt2"s},
          {"tokenizer.ggml.tokens", tokens},
          {"tokenizer.ggml.token_type", types},
          {"tokenizer.ggml.merges", std::vector<std::string>{"h e", "\xC4\xA0 he"}},
          {"tokenizer.ggml.eos_token_id", uint32_t{258}},
          {"tokenizer.ggml.add_bos_token", false}};
}

constexpr TokenId kHe = 256, kSpaceHe = 257, kImEnd = 258;

// A sentencepiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then pieces with scores chosen
// so that the order of merges, not their length, decides: "bc" beats "▁a", which beats "ab".
Metadata TinyLlama() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
    scores.push_back(0);
  }
  const std::vector<std::pair<std::string, float>> pieces = {
      {"\xE2\x96\x81", -10}, {"a", -11}, {"b", -12}, {"c", -13},
      {"\xE2\x96\x81" "a", -2}, {"ab", -3}, {"bc", -1}, {"\xE2\x96\x81" "ab", -4}};
  for (const auto& [p, s] : pieces) {
    tokens.push_back(p);
    types.push_back(1);
    scores.push_back(s);
  }
  return {{"tokenizer.ggml.model", "llama"s},
          {"tokenizer.ggml.tokens", tokens},
          {"tokenizer.ggml.token_type", types},
          {"tokenizer.ggml.scores", scores},
          {"tokenizer.ggml.bos_token_id", uint32_t{1}},
          {"tokenizer.ggml.eos_token_id", uint32_t{2}}};
}

constexpr TokenId kSpace = 259, kA = 260, kSpaceA = 263, kBc = 265, kSpaceAb = 266;

std::unique_ptr<Tokenizer> Load(const std::string& path) {
  auto t = LoadGgufTokenizer(path);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

// The real SmolLM2 file; a test that needs it fails (never skips) when it is missing.
std::unique_ptr<Tokenizer> LoadSmolLm2() {
  const std::string path = testing::SmolLm2Gguf();
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << path << " is missing: run scripts/fetch_models.sh (or set SPECULA_GGUF_CACHE)";
    return nullptr;
  }
  return Load(path);
}

void ExpectRoundTrip(const Tokenizer& tok, const std::string& s) {
  for (bool bos : {false, true}) {
    const std::vector<TokenId> ids = tok.Encode(s, bos);
    EXPECT_EQ(tok.Decode(ids), s) << "bos=" << bos;
    std::string streamed;  // token by token, as a stream decodes
    TokenId prev = -1;
    for (TokenId id : ids) {
      streamed += tok.DecodeToken(prev, id);
      prev = id;
    }
    EXPECT_EQ(streamed, s);
  }
}

const std::vector<std::string>& Corpus() {
  static const auto* corpus = new std::vector<std::string>{
      "",
      "Hello, world! The quick brown fox.",
      "  two leading spaces and trailing  ",
      "tabs\tand\nnewlines\r\n\r\n",
      "It's we'll you're I'M they'D",
      "Numbers 0 7 42 123 4567 8901234 3.14159 -273.15 ²½٣３",
      "def f(x):\n    return x ** 2  # square\n",
      "从前有一个小女孩，她叫莉莉。",
      "emoji 😀🚀👩‍💻🇫🇷 end",
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
      "text<|im_end|>glued<|endoftext|>",
      "\u00a0nbsp \u3000ideographic \u2009thin",
      "invalid \xed\xa0\x80 surrogate \xc3( and a cut \xe4\xb8"s,
      "\x80\x80 lone continuation bytes \xf0\x9f"s,
      "nul \0 inside"s,
  };
  return *corpus;
}

TEST(GgufTokenizerTest, SmolLm2VocabularyAndSpecialIds) {
  auto tok = LoadSmolLm2();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->bos_id(), 1);  // <|im_start|>
  ASSERT_FALSE(tok->eos_ids().empty());
  EXPECT_EQ(tok->eos_ids().front(), 2);  // <|im_end|>: eos_token_id, the end of a chat turn
  // <|endoftext|> (0) ends generation too, as in llama.cpp.
  EXPECT_EQ(tok->eos_ids(), (std::vector<TokenId>{2, 0}));
  EXPECT_FALSE(tok->add_bos_default());  // tokenizer.ggml.add_bos_token = false
}

TEST(GgufTokenizerTest, SmolLm2SpecialTokensAreSingleIds) {
  auto tok = LoadSmolLm2();
  ASSERT_NE(tok, nullptr);
  // HF tokenizers (transformers' GGUF conversion) gives the same ids.
  EXPECT_EQ(tok->Encode("<|im_start|>user\nHi<|im_end|>", false), (std::vector<TokenId>{1, 4093, 198, 26843, 2}));
  EXPECT_EQ(tok->Encode("Hello world! 123", false), (std::vector<TokenId>{19556, 905, 17, 216, 33, 34, 35}));
  EXPECT_EQ(tok->Decode(tok->Encode("<|im_start|>user\nHi<|im_end|>", false)), "user\nHi");
  EXPECT_EQ(tok->Encode("Hi", true), (std::vector<TokenId>{1, 26843}));
  // SmolLM2 has no symbol for 21 bytes (0xFF among them): like HF and llama.cpp, they are dropped.
  EXPECT_EQ(tok->Decode(tok->Encode("a\xff b", false)), "a b");
}

TEST(GgufTokenizerTest, SmolLm2RoundTrips) {
  auto tok = LoadSmolLm2();
  ASSERT_NE(tok, nullptr);
  for (const std::string& s : Corpus()) {
    if (s.find("<|") != std::string::npos) continue;  // specials decode to nothing
    SCOPED_TRACE(s);
    ExpectRoundTrip(*tok, s);
  }
}

TEST(GgufTokenizerTest, LoadTokenizerDispatchesOnExtensionAndMagic) {
  auto by_name = LoadTokenizer(WriteGguf(TinyGpt2(), "tiny.gguf"), 0);
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ((*by_name)->vocab_size(), 259);
  auto by_magic = LoadTokenizer(WriteGguf(TinyGpt2(), "tiny_model.bin"), 0);
  ASSERT_TRUE(by_magic.ok()) << by_magic.status();
  EXPECT_EQ((*by_magic)->vocab_size(), 259);
}

TEST(GgufTokenizerTest, ByteLevelMergesAndControlTokens) {
  auto tok = Load(WriteGguf(TinyGpt2(), "gpt2.gguf"));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode(" he he<|im_end|>", false), (std::vector<TokenId>{kSpaceHe, kSpaceHe, kImEnd}));
  EXPECT_EQ(tok->Encode("hehe", false), (std::vector<TokenId>{kHe, kHe}));
  EXPECT_EQ(tok->eos_ids(), std::vector<TokenId>{kImEnd});
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_EQ(tok->DecodeToken(-1, kImEnd), "");
  for (const std::string& s : Corpus()) {
    if (s.find("<|") == std::string::npos) ExpectRoundTrip(*tok, s);
  }
}

TEST(GgufTokenizerTest, SentencepieceMergesByScoreWithByteFallback) {
  auto tok = Load(WriteGguf(TinyLlama(), "llama.gguf"));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_ids(), std::vector<TokenId>{2});
  EXPECT_TRUE(tok->add_bos_default());  // llama.cpp's default for sentencepiece files
  // "▁abc": bc (-1) merges before ▁a (-2), so ab (-3) and ▁ab (-4) never form.
  EXPECT_EQ(tok->Encode("abc", true), (std::vector<TokenId>{1, kSpaceA, kBc}));
  EXPECT_EQ(tok->Encode("ab", false), (std::vector<TokenId>{kSpaceAb}));
  // "é" is not a piece: its two bytes, <0xC3> <0xA9>.
  EXPECT_EQ(tok->Encode("a é", false), (std::vector<TokenId>{kSpaceA, kSpace, 3 + 0xC3, 3 + 0xA9}));
  // The prefix space goes after <s> in the text too, and decoding drops it again.
  EXPECT_EQ(tok->Encode("<s>a", false), (std::vector<TokenId>{1, kSpaceA}));
  EXPECT_EQ(tok->Decode({1, kSpaceA, kBc}), "abc");
  EXPECT_EQ(tok->DecodeToken(kA, kSpaceA), " a");
  for (const std::string& s : Corpus()) {
    if (s.find("<|") == std::string::npos) ExpectRoundTrip(*tok, s);
  }
}

TEST(GgufTokenizerTest, AddSpacePrefixFalseKeepsTheTextAsIs) {
  Metadata kv = TinyLlama();
  kv["tokenizer.ggml.add_space_prefix"] = false;
  kv["tokenizer.ggml.add_bos_token"] = false;
  auto tok = Load(WriteGguf(kv, "llama_noprefix.gguf"));
  ASSERT_NE(tok, nullptr);
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_EQ(tok->Encode("a", false), (std::vector<TokenId>{kA}));
  EXPECT_EQ(tok->Encode(" a", false), (std::vector<TokenId>{kSpaceA}));
  EXPECT_EQ(tok->Decode(tok->Encode(" a", false)), " a");
}

TEST(GgufTokenizerTest, BadMetadataNamesTheKey) {
  struct Case {
    const char* name;
    Metadata kv;
    std::string key;   // the error names this key
    std::string also;  // and says this
  };
  std::vector<Case> cases;
  auto gpt2 = [&](const char* name, auto edit, std::string key, std::string also) {
    Metadata kv = TinyGpt2();
    edit(kv);
    cases.push_back({name, std::move(kv), std::move(key), std::move(also)});
  };
  auto llama = [&](const char* name, auto edit, std::string key, std::string also) {
    Metadata kv = TinyLlama();
    edit(kv);
    cases.push_back({name, std::move(kv), std::move(key), std::move(also)});
  };
  auto tokens_of = [](Metadata& kv) -> std::vector<std::string>& {
    return std::get<std::vector<std::string>>(kv["tokenizer.ggml.tokens"]);
  };
  gpt2("unknown_model", [](Metadata& kv) { kv["tokenizer.ggml.model"] = "bert"s; }, "tokenizer.ggml.model",
       "'bert' is not supported (gpt2 or llama)");
  gpt2("missing_model", [](Metadata& kv) { kv.erase("tokenizer.ggml.model"); }, "tokenizer.ggml.model", "missing");
  gpt2("unknown_pre", [](Metadata& kv) { kv["tokenizer.ggml.pre"] = "tekken"s; }, "tokenizer.ggml.pre",
       "'tekken' is not supported (default, gpt2, gpt-2, smollm, llama-bpe");
  gpt2("missing_tokens", [](Metadata& kv) { kv.erase("tokenizer.ggml.tokens"); }, "tokenizer.ggml.tokens",
       "missing");
  gpt2("missing_merges", [](Metadata& kv) { kv.erase("tokenizer.ggml.merges"); }, "tokenizer.ggml.merges",
       "missing");
  gpt2("merge_unknown_token",
       [](Metadata& kv) { kv["tokenizer.ggml.merges"] = std::vector<std::string>{"h e", "x yz"}; },
       "tokenizer.ggml.merges[1]", "names 'yz', which is not in tokenizer.ggml.tokens");
  gpt2("merge_without_space",
       [](Metadata& kv) { kv["tokenizer.ggml.merges"] = std::vector<std::string>{"he"}; },
       "tokenizer.ggml.merges[0]", "is not 'left right'");
  gpt2("token_type_too_short",
       [](Metadata& kv) { kv["tokenizer.ggml.token_type"] = std::vector<int32_t>(10, 1); },
       "tokenizer.ggml.token_type", "has 10 entries, but tokenizer.ggml.tokens has 259");
  gpt2("token_type_value",
       [](Metadata& kv) { std::get<std::vector<int32_t>>(kv["tokenizer.ggml.token_type"])[7] = 9; },
       "tokenizer.ggml.token_type[7]", "is 9");
  gpt2("token_type_not_ints", [](Metadata& kv) { kv["tokenizer.ggml.token_type"] = "normal"s; },
       "tokenizer.ggml.token_type", "is not an array of integers");
  gpt2("eos_out_of_range", [](Metadata& kv) { kv["tokenizer.ggml.eos_token_id"] = uint32_t{259}; },
       "tokenizer.ggml.eos_token_id", "is 259, outside the 259 tokens");
  gpt2("bos_out_of_range", [](Metadata& kv) { kv["tokenizer.ggml.bos_token_id"] = uint32_t{100000}; },
       "tokenizer.ggml.bos_token_id", "is 100000");
  gpt2("add_bos_without_bos", [](Metadata& kv) { kv["tokenizer.ggml.add_bos_token"] = true; },
       "tokenizer.ggml.add_bos_token", "bos_token_id is not set");
  gpt2("duplicate_token", [&](Metadata& kv) { tokens_of(kv)[257] = "he"; }, "tokenizer.ggml.tokens[257]",
       "'he' repeats tokenizer.ggml.tokens[256]");
  gpt2("empty_vocabulary",
       [](Metadata& kv) {
         kv["tokenizer.ggml.tokens"] = std::vector<std::string>{};
         kv.erase("tokenizer.ggml.token_type");
       },
       "tokenizer.ggml.tokens", "is empty");
  llama("missing_scores", [](Metadata& kv) { kv.erase("tokenizer.ggml.scores"); }, "tokenizer.ggml.scores",
        "is missing");
  llama("scores_too_long",
        [](Metadata& kv) { std::get<std::vector<float>>(kv["tokenizer.ggml.scores"]).push_back(0); },
        "tokenizer.ggml.scores", "has 268 entries, but tokenizer.ggml.tokens has 267");
  llama("nan_score",
        [](Metadata& kv) { std::get<std::vector<float>>(kv["tokenizer.ggml.scores"])[260] = std::nanf(""); },
        "tokenizer.ggml.scores[260]", "is NaN");
  llama("unk_out_of_range", [](Metadata& kv) { kv["tokenizer.ggml.unknown_token_id"] = uint32_t{267}; },
        "tokenizer.ggml.unknown_token_id", "outside the 267 tokens");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = WriteGguf(c.kv, std::string(c.name) + ".gguf");
    auto t = LoadGgufTokenizer(path);
    ASSERT_FALSE(t.ok());
    const std::string msg(t.status().message());
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.key), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.also), std::string::npos) << msg;
  }
}

TEST(GgufTokenizerTest, NotAGgufFile) {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/fake.gguf") << "not a gguf file at all";
  auto t = LoadTokenizer(dir + "/fake.gguf", 0);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("fake.gguf"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace specula

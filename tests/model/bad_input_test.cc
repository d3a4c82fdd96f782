// Bad input gives one clear error that names the file or field, never a crash (also under ASan).
#include <cstring>
#include <fstream>

#include "core/mapped_file.h"
#include "tests/one_sequence.h"
#include "model/make_model.h"
#include "model/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace specula {
namespace {

using json = nlohmann::json;

void ExpectErrorMentions(const absl::Status& st, std::vector<std::string> parts) {
  ASSERT_FALSE(st.ok());
  for (const auto& p : parts) EXPECT_NE(st.message().find(p), std::string::npos) << st << " lacks '" << p << "'";
}

std::string ReadAll(const std::string& path) { return *ReadTextFile(path); }

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(BadLlama2cTest, TruncatedFile) {
  const std::string good = ReadAll(testing::TinyStoriesDir() + "/stories260K.bin");
  const std::string dir = testing::MakeTempDir();
  for (size_t len : {size_t{0}, size_t{10}, size_t{28}, size_t{1000}, good.size() - 4}) {
    WriteAll(dir + "/cut.bin", good.substr(0, len));
    ExpectErrorMentions(LoadLlama2c(dir + "/cut.bin").status(), {dir + "/cut.bin"});
  }
  WriteAll(dir + "/cut.bin", good.substr(0, 1000));
  ExpectErrorMentions(LoadLlama2c(dir + "/cut.bin").status(), {"truncated or corrupted", "1000"});
}

TEST(BadLlama2cTest, CorruptedHeader) {
  std::string bytes = ReadAll(testing::TinyStoriesDir() + "/stories260K.bin");
  const std::string dir = testing::MakeTempDir();
  struct Case { int field; int32_t value; const char* mention; };
  for (const Case& c : {Case{0, 0, "hidden_size"}, Case{3, 7, "n_heads"}, Case{4, 3, "num_key_value_heads"},
                        Case{5, 1 << 30, "implausible"}, Case{2, -2, "num_hidden_layers"},
                        Case{1, 999, "implies"}}) {
    std::string b = bytes;
    std::memcpy(b.data() + 4 * c.field, &c.value, 4);
    WriteAll(dir + "/bad.bin", b);
    ExpectErrorMentions(LoadLlama2c(dir + "/bad.bin").status(), {dir + "/bad.bin", c.mention});
  }
}

// Found by fuzz/llama2c_fuzz (the 28-byte header is the whole input): every value is under the 2^24
// plausibility bound, but layers * dim * dim overflowed int64 while sizing the file (UBSan: signed
// integer overflow). ValidateConfig now bounds the parameter count, which keeps every size in int64.
TEST(BadLlama2cTest, HeaderImplyingAFileBeyondInt64) {
  const int32_t header[7] = {8978496, 172, 3014661, 8, 4, 512, 512};  // dim, hidden, layers, heads, kv, vocab, seq
  const std::string path = testing::MakeTempDir() + "/huge.bin";
  WriteAll(path, std::string(reinterpret_cast<const char*>(header), sizeof(header)));
  ExpectErrorMentions(LoadLlama2c(path).status(), {path, "parameters, implausibly many"});
}

TEST(BadFilesTest, MissingFiles) {
  ExpectErrorMentions(LoadModel("/no/such/model.bin").status(), {"/no/such/model.bin"});
  const std::string dir = testing::MakeTempDir();
  ExpectErrorMentions(LoadHfModel(dir).status(), {dir + "/config.json"});
}

class BadHfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    auto shape = NamedShape("tiny");
    ASSERT_TRUE(shape.ok());
    ASSERT_TRUE(WriteRandomModel(*shape, dir_, DType::kF32, 1).ok());
    ASSERT_TRUE(LoadHfModel(dir_).ok());
    st_bytes_ = ReadAll(dir_ + "/model.safetensors");
    std::memcpy(&header_len_, st_bytes_.data(), 8);
    header_ = json::parse(st_bytes_.substr(8, header_len_));
    config_ = json::parse(ReadAll(dir_ + "/config.json"));
  }
  // Rewrites the safetensors header (keeping the data section as it was).
  void WriteHeader(const json& h) {
    std::string text = h.dump();
    const uint64_t len = text.size();
    std::string out(reinterpret_cast<const char*>(&len), 8);
    WriteAll(dir_ + "/model.safetensors", out + text + st_bytes_.substr(8 + header_len_));
  }
  void WriteConfig(const json& c) { WriteAll(dir_ + "/config.json", c.dump()); }

  std::string dir_, st_bytes_;
  uint64_t header_len_ = 0;
  json header_, config_;
};

TEST_F(BadHfTest, OffsetsOutsideTheFile) {
  json h = header_;
  h["model.norm.weight"]["data_offsets"][1] = 1ull << 40;
  WriteHeader(h);
  ExpectErrorMentions(LoadHfModel(dir_).status(), {"model.safetensors", "model.norm.weight", "data_offsets"});
}

TEST_F(BadHfTest, OffsetsThatDisagreeWithShape) {
  json h = header_;
  h["model.norm.weight"]["data_offsets"][1] = h["model.norm.weight"]["data_offsets"][1].get<uint64_t>() - 4;
  WriteHeader(h);
  ExpectErrorMentions(LoadHfModel(dir_).status(), {"model.norm.weight", "needs"});
}

TEST_F(BadHfTest, WrongDtype) {
  json h = header_;
  h["model.norm.weight"]["dtype"] = "I64";
  WriteHeader(h);
  ExpectErrorMentions(LoadHfModel(dir_).status(), {"model.norm.weight", "I64"});
}

TEST_F(BadHfTest, ShapeMismatchWithConfig) {
  json h = header_;
  auto& e = h["model.layers.0.mlp.up_proj.weight"];
  const int64_t rows = e["shape"][0], cols = e["shape"][1];
  e["shape"] = {cols, rows};
  WriteHeader(h);
  ExpectErrorMentions(LoadHfModel(dir_).status(), {"model.layers.0.mlp.up_proj.weight", "config.json implies"});
}

TEST_F(BadHfTest, HeaderLengthLies) {
  std::string b = st_bytes_;
  const uint64_t huge = 1ull << 50;
  std::memcpy(b.data(), &huge, 8);
  WriteAll(dir_ + "/model.safetensors", b);
  ExpectErrorMentions(LoadHfModel(dir_).status(), {"model.safetensors", "header length"});
  WriteAll(dir_ + "/model.safetensors", st_bytes_.substr(0, 5));
  ExpectErrorMentions(LoadHfModel(dir_).status(), {"model.safetensors", "no header"});
  std::string garbage = st_bytes_;
  garbage[8] = '#';
  WriteAll(dir_ + "/model.safetensors", garbage);
  ExpectErrorMentions(LoadHfModel(dir_).status(), {"model.safetensors", "not a JSON object"});
}

TEST_F(BadHfTest, MissingTensor) {
  json h = header_;
  h.erase("model.layers.1.self_attn.k_proj.weight");
  WriteHeader(h);
  ExpectErrorMentions(LoadHfModel(dir_).status(), {"model.layers.1.self_attn.k_proj.weight", "missing"});
}

TEST_F(BadHfTest, ConfigMissingOrInconsistentFields) {
  struct Case { const char* field; json value; const char* mention; };
  for (const Case& c : {Case{"hidden_size", nullptr, "'hidden_size' is missing"},
                        Case{"num_key_value_heads", 3, "num_key_value_heads"},
                        Case{"num_attention_heads", 5, "num_attention_heads"},
                        Case{"vocab_size", "big", "'vocab_size' must be an integer"},
                        Case{"intermediate_size", -4, "intermediate_size"},
                        Case{"rope_scaling", json{{"rope_type", "yarn"}}, "rope_scaling.rope_type"},
                        Case{"model_type", "bert", "model_type"}}) {
    json cfg = config_;
    if (c.value.is_null()) {
      cfg.erase(c.field);
    } else {
      cfg[c.field] = c.value;
    }
    WriteConfig(cfg);
    ExpectErrorMentions(LoadHfModel(dir_).status(), {"config.json", c.mention});
  }
  WriteAll(dir_ + "/config.json", "{ not json");
  ExpectErrorMentions(LoadHfModel(dir_).status(), {"config.json", "not a valid JSON"});
}

// Found by review while writing fuzz/hf_config_fuzz, reproduced with it (crashes, undefined
// behaviour and silent misreadings): nlohmann's value() threw on a model_type or rope_type that is not a string; an eos id
// past int32 wrapped onto another id; num_attention_heads * head_dim overflowed int32 in q_dim()
// (UBSan), and the weight counts int64; infinite eps passed; and a layer count the checkpoint
// cannot hold was allocated (std::bad_alloc) before any tensor was looked up.
TEST_F(BadHfTest, ConfigValuesOfTheWrongTypeOrSizeAreErrors) {
  struct Case { json fields; std::vector<std::string> mentions; };
  for (const Case& c : {
           Case{{{"model_type", 7}}, {"'model_type' must be a string"}},
           Case{{{"rope_scaling", {{"rope_type", 3}}}}, {"'rope_scaling.rope_type' must be a string"}},
           Case{{{"rope_scaling", {{"type", json::array()}}}}, {"'rope_scaling.type' must be a string"}},
           Case{{{"eos_token_id", 4294967298ull}}, {"'eos_token_id'", "4294967298 is out of range"}},
           Case{{{"eos_token_id", {1, -4294967295ll}}}, {"'eos_token_id'", "-4294967295 is out of range"}},
           Case{{{"rms_norm_eps", 1e300}}, {"'rms_norm_eps' must be positive and finite"}},
           Case{{{"head_dim", 65536}, {"num_attention_heads", 65536}, {"num_key_value_heads", 65536}},
                {"'head_dim'", "times num_attention_heads", "more than 2^31 - 1"}},
           Case{{{"hidden_size", 1 << 30}, {"intermediate_size", 2000000000}}, {"'hidden_size'", "implausibly many"}},
           Case{{{"num_hidden_layers", 2147483647}}, {"'num_hidden_layers' (2147483647) needs at least 9 tensors per layer"}}}) {
    SCOPED_TRACE(c.fields.dump());
    json cfg = config_;
    cfg.update(c.fields);
    WriteConfig(cfg);
    std::vector<std::string> mentions = c.mentions;
    mentions.push_back("config.json");
    ExpectErrorMentions(LoadHfModel(dir_).status(), mentions);
  }
}

TEST(BadPromptTest, PromptLongerThanContext) {
  auto w = LoadModel(testing::TinyStoriesDir() + "/stories260K.bin");
  ASSERT_TRUE(w.ok());
  LlamaModel model(std::move(w).value(), MakeCpuBackend());
  std::vector<TokenId> prompt(600, 5);
  auto r = Generate(model, prompt, GenerateOptions{});
  ExpectErrorMentions(r.status(), {"600 tokens", "context of 512"});
  EXPECT_FALSE(Generate(model, {}, GenerateOptions{}).ok());
  // The model is still usable after the errors.
  std::vector<TokenId> ok_prompt = {1, 403};
  EXPECT_TRUE(Generate(model, ok_prompt, GenerateOptions{}).ok());
}

}  // namespace
}  // namespace specula

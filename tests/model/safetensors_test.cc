#include "model/safetensors.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "nlohmann/json.hpp"

#include "model/make_model.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specula {
namespace {

TEST(HalfTest, Bf16AndF16RoundTripRepresentableValues) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(F16ToF32(F32ToF16(f)), f) << f;
  }
  for (float f : {0.0f, 1.0f, -3.0f, 0x1.8p100f, -0x1.8p-64f}) EXPECT_EQ(Bf16ToF32(F32ToBf16(f)), f) << f;
  EXPECT_EQ(F32ToF16(1e6f), 0x7c00);  // overflow to +inf
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
  // Round to nearest: relative error below half an ulp.
  for (float f = -3.0f; f < 3.0f; f += 0.0137f) {
    EXPECT_NEAR(F16ToF32(F32ToF16(f)), f, std::abs(f) * 4.9e-4 + 3e-8);
    EXPECT_NEAR(Bf16ToF32(F32ToBf16(f)), f, std::abs(f) * 3.91e-3 + 1e-38);
  }
}

TEST(MakeModelTest, NamedShapesAreRealAndWeightsAreNotDegenerate) {
  auto s = NamedShape("stories15m");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dim, 288);
  EXPECT_EQ(s->num_layers, 6);
  EXPECT_EQ(s->num_heads, 6);
  EXPECT_EQ(s->vocab_size, 32000);
  EXPECT_EQ(s->hidden_dim, 768);
  for (const char* name : {"tiny", "smollm2-135m", "llama-3.2-1b", "llama-3-8b"}) EXPECT_TRUE(NamedShape(name).ok()) << name;
  EXPECT_NEAR(NamedShape("llama-3-8b")->NumParams() / 1e9, 8.03, 0.01);
  EXPECT_NEAR(NamedShape("llama-3.2-1b")->NumParams() / 1e9, 1.236, 0.01);
  EXPECT_FALSE(NamedShape("gpt-5").ok());

  const std::string dir = testing::MakeTempDir();
  ModelConfig c = *NamedShape("tiny");
  ASSERT_TRUE(WriteRandomModel(c, dir, DType::kBF16, 3).ok());
  auto w = LoadHfModel(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const int64_t n = static_cast<int64_t>(c.hidden_dim) * c.dim;
  const float* gate = (*w)->layers[0].w_gate.f32();
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NE(gate[i], 0.0f);
    sum += gate[i];
    sq += gate[i] * gate[i];
  }
  const double std = std::sqrt(sq / n - (sum / n) * (sum / n));
  EXPECT_NEAR(std, 1.0 / std::sqrt(c.dim), 0.01);  // 1/sqrt(fan_in)
  EXPECT_NEAR((*w)->final_norm[0], 1.0f, 0.1f);
  // The byte symbols model/ writes are the byte map the tokenizers read.
  auto tok = LoadHfTokenizer(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (TokenId b = 0; b < 256; ++b) EXPECT_EQ((*tok)->DecodeToken(-1, b), std::string(1, static_cast<char>(b))) << b;
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// The output directory is made with its parents, as `mkdir -p`; a path through a file is refused by name.
TEST(MakeModelTest, CreatesParentDirectoriesAndNamesAPathItCannotMake) {
  const std::string root = testing::MakeTempDir();
  ModelConfig c = *NamedShape("tiny");
  ASSERT_TRUE(WriteRandomModel(c, root + "/a/b", DType::kF32, 1).ok());
  EXPECT_TRUE(SafetensorsFile::Open(root + "/a/b/model.safetensors").ok());
  std::ofstream(root + "/file") << "x";
  const absl::Status st = WriteRandomModel(c, root + "/file/m", DType::kF32, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(root + "/file/m: cannot create the output directory"), std::string::npos) << st;
}

// A model split into two shards with model.safetensors.index.json loads to the same weights.
TEST(ShardedTest, IndexedShardsLoadLikeOneFile) {
  const std::string one = testing::MakeTempDir(), sharded = testing::MakeTempDir();
  ModelConfig c = *NamedShape("tiny");
  ASSERT_TRUE(WriteRandomModel(c, one, DType::kF16, 5).ok());
  auto single = SafetensorsFile::Open(one + "/model.safetensors");
  ASSERT_TRUE(single.ok());
  // Split the tensors between two shard files and write the index.
  std::vector<TensorSpec> a, b;
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, e] : single->tensors()) {
    const bool first = name.find("layers.1.") == std::string::npos;
    (first ? a : b).push_back({name, e.shape});
    weight_map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  for (auto [specs, file] : {std::pair{&a, "model-00001-of-00002.safetensors"}, {&b, "model-00002-of-00002.safetensors"}}) {
    auto fill = [&, specs = specs](size_t i, float* out) {
      const TensorEntry& e = single->tensors().at((*specs)[i].name);
      for (int64_t j = 0; j < e.num_bytes / 2; ++j) {
        uint16_t h;
        std::memcpy(&h, e.data + 2 * j, 2);
        out[j] = F16ToF32(h);
      }
    };
    ASSERT_TRUE(WriteSafetensors(sharded + "/" + file, *specs, DType::kF16, fill).ok());
  }
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  std::ofstream(sharded + "/model.safetensors.index.json") << index.dump();
  std::ofstream(sharded + "/config.json") << HfConfigJson(c, "float16");
  auto w1 = LoadHfModel(one);
  auto w2 = LoadHfModel(sharded);
  ASSERT_TRUE(w1.ok()) << w1.status();
  ASSERT_TRUE(w2.ok()) << w2.status();
  EXPECT_EQ((*w2)->files.size(), 2u);
  const int64_t n = static_cast<int64_t>(c.hidden_dim) * c.dim;
  EXPECT_TRUE(std::equal((*w1)->layers[1].w_up.f32(), (*w1)->layers[1].w_up.f32() + n, (*w2)->layers[1].w_up.f32()));
  EXPECT_TRUE(std::equal((*w1)->embed.f32(), (*w1)->embed.f32() + int64_t{c.vocab_size} * c.dim, (*w2)->embed.f32()));
  // A shard named in the index but absent is an error naming it.
  std::remove((sharded + "/model-00002-of-00002.safetensors").c_str());
  auto missing = LoadHfModel(sharded);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model-00002-of-00002.safetensors"), std::string::npos) << missing.status();
}

}  // namespace
}  // namespace specula

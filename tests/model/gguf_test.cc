// GGUF: a tiny model written here loads with its config and tensors; truncated, oversized and
// field-corrupted variants of it get one-line errors naming the field (never a crash: the suite
// also runs under ASan); a bounded random byte-flip loop only ever errors or loads.
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/gguf.h"
#include "gtest/gtest.h"
#include "model/llama_model.h"
#include "model/weights.h"
#include "tests/test_util.h"

namespace specula {
namespace {

// A minimal GGUF writer: metadata in order, then tensors (F32 norms, Q8_0 matrices).
class Writer {
 public:
  void Str(const std::string& s) {
    U64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F32(float v) { Raw(&v, 4); }
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

struct TinyTensor {
  std::string name;
  std::vector<uint64_t> dims;
  QuantType type;
  std::vector<uint8_t> data;
};

// A 2-layer llama: dim 64, 2 heads (1 KV head), hidden 64, vocab 32, context 16.
constexpr int kDim = 64, kHidden = 64, kVocab = 32, kKv = 32;

std::vector<uint8_t> Q8Blocks(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.1f);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = n(rng);
  std::vector<uint8_t> out(rows * cols / kQK * sizeof(BlockQ8_0));
  QuantizeRowQ8_0(x.data(), rows * cols, reinterpret_cast<BlockQ8_0*>(out.data()));
  return out;
}

std::vector<TinyTensor> TinyTensors() {
  std::vector<TinyTensor> t;
  auto norm = [](const std::string& name) {
    std::vector<float> v(kDim, 1.0f);
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return TinyTensor{name, {kDim}, QuantType::kF32, b};
  };
  auto mat = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    return TinyTensor{name, {cols, rows}, QuantType::kQ8_0, Q8Blocks(rows, cols, static_cast<uint32_t>(t.size()))};
  };
  t.push_back(mat("token_embd.weight", kVocab, kDim));
  t.push_back(norm("output_norm.weight"));
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    t.push_back(norm(p + "attn_norm.weight"));
    t.push_back(mat(p + "attn_q.weight", kDim, kDim));
    t.push_back(mat(p + "attn_k.weight", kKv, kDim));
    t.push_back(mat(p + "attn_v.weight", kKv, kDim));
    t.push_back(mat(p + "attn_output.weight", kDim, kDim));
    t.push_back(norm(p + "ffn_norm.weight"));
    t.push_back(mat(p + "ffn_gate.weight", kHidden, kDim));
    t.push_back(mat(p + "ffn_up.weight", kHidden, kDim));
    t.push_back(mat(p + "ffn_down.weight", kDim, kHidden));
  }
  return t;
}

// Byte offsets of interesting fields, for the corruption cases.
struct Layout {
  size_t n_tensors, n_kv, first_key_len, block_count_value, tokens_array_count;
  size_t first_tensor_ndims, first_tensor_dim0, first_tensor_type, first_tensor_offset, data_start;
};

std::vector<uint8_t> TinyGguf(Layout* layout = nullptr, const std::string& arch = "llama") {
  Writer w;
  Layout lo{};
  std::vector<TinyTensor> tensors = TinyTensors();
  w.U32(0x46554747);
  w.U32(3);
  lo.n_tensors = w.bytes().size();
  w.U64(tensors.size());
  lo.n_kv = w.bytes().size();
  w.U64(10);
  auto key = [&](const std::string& k, uint32_t type) {
    w.Str(k);
    w.U32(type);
  };
  lo.first_key_len = w.bytes().size();
  key("general.architecture", 8);
  w.Str(arch);
  key(arch + ".block_count", 4);
  lo.block_count_value = w.bytes().size();
  w.U32(2);
  key(arch + ".embedding_length", 4);
  w.U32(kDim);
  key(arch + ".feed_forward_length", 4);
  w.U32(kHidden);
  key(arch + ".attention.head_count", 4);
  w.U32(2);
  key(arch + ".attention.head_count_kv", 4);
  w.U32(1);
  key(arch + ".context_length", 4);
  w.U32(16);
  key(arch + ".attention.layer_norm_rms_epsilon", 6);
  w.F32(1e-5f);
  key(arch + ".vocab_size", 4);
  w.U32(kVocab);
  key("tokenizer.ggml.scores", 9);
  w.U32(6);  // f32
  lo.tokens_array_count = w.bytes().size();
  w.U64(kVocab);
  for (int i = 0; i < kVocab; ++i) w.F32(-static_cast<float>(i));
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TinyTensor& t = tensors[i];
    w.Str(t.name);
    if (i == 0) lo.first_tensor_ndims = w.bytes().size();
    w.U32(static_cast<uint32_t>(t.dims.size()));
    if (i == 0) lo.first_tensor_dim0 = w.bytes().size();
    for (uint64_t d : t.dims) w.U64(d);
    if (i == 0) lo.first_tensor_type = w.bytes().size();
    w.U32(static_cast<uint32_t>(t.type));
    if (i == 0) lo.first_tensor_offset = w.bytes().size();
    w.U64(offset);
    offsets.push_back(offset);
    offset += (t.data.size() + 31) / 32 * 32;
  }
  w.bytes().resize((w.bytes().size() + 31) / 32 * 32, 0);
  lo.data_start = w.bytes().size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    w.bytes().resize(lo.data_start + offsets[i], 0);
    w.Raw(tensors[i].data.data(), tensors[i].data.size());
  }
  if (layout != nullptr) *layout = lo;
  return w.bytes();
}

template <typename T>
void Put(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

class GgufTest : public ::testing::Test {
 protected:
  std::string Write(const std::vector<uint8_t>& bytes, const std::string& name = "m.gguf") {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return path;
  }
  // Loading fails with an error that mentions `what`.
  void ExpectError(const std::vector<uint8_t>& bytes, const std::string& what) {
    auto w = LoadGguf(Write(bytes));
    ASSERT_FALSE(w.ok()) << "expected an error mentioning: " << what;
    const std::string msg(w.status().message());
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    EXPECT_NE(msg.find(dir_), std::string::npos) << "names the file: " << msg;
  }
  std::string dir_ = testing::MakeTempDir();
};

TEST_F(GgufTest, TinyModelLoadsItsConfigAndTensors) {
  auto w = LoadModel(Write(TinyGguf()));  // picked by the magic, not the name
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelConfig& c = (*w)->config;
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.dim, kDim);
  EXPECT_EQ(c.num_heads, 2);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.vocab_size, kVocab);
  EXPECT_EQ(c.max_seq_len, 16);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_EQ((*w)->layers[1].wq.type, QuantType::kQ8_0);
  EXPECT_EQ((*w)->lm_head, (*w)->embed);
  // Qwen2 files rotate halves.
  auto q = LoadModel(Write(TinyGguf(nullptr, "qwen2"), "q.gguf"));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_FALSE((*q)->config.rope_interleaved);
}

TEST_F(GgufTest, EveryTruncationIsAnErrorNamingTheFile) {
  const std::vector<uint8_t> full = TinyGguf();
  // Every prefix of the header and tensor directory, and a sample of the data section.
  Layout lo;
  TinyGguf(&lo);
  for (size_t n = 0; n < full.size(); n += (n < lo.data_start + 64 ? 1 : 997)) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + n);
    auto w = LoadGguf(Write(cut));
    ASSERT_FALSE(w.ok()) << "a file cut at " << n << " of " << full.size() << " bytes loaded";
  }
}

TEST_F(GgufTest, CorruptedFieldsNameTheField) {
  Layout lo;
  const std::vector<uint8_t> good = TinyGguf(&lo);
  struct Case {
    const char* what;
    std::function<void(std::vector<uint8_t>&)> corrupt;
  };
  const std::vector<Case> cases = {
      {"bad magic", [](auto& b) { b[0] = 'X'; }},
      {"version 1", [](auto& b) { Put<uint32_t>(b, 4, 1); }},
      {"version 7", [](auto& b) { Put<uint32_t>(b, 4, 7); }},
      {"tensor count", [&](auto& b) { Put<uint64_t>(b, lo.n_tensors, 1ull << 60); }},
      {"metadata count", [&](auto& b) { Put<uint64_t>(b, lo.n_kv, 1ull << 60); }},
      {"string length", [&](auto& b) { Put<uint64_t>(b, lo.first_key_len, 1ull << 62); }},
      {"unknown value type", [&](auto& b) { Put<uint32_t>(b, lo.first_key_len + 8 + 20, 99); }},
      {"array length", [&](auto& b) { Put<uint64_t>(b, lo.tokens_array_count, 1ull << 61); }},
      {"array element type", [&](auto& b) { Put<uint32_t>(b, lo.tokens_array_count - 4, 9); }},
      {"block_count = 0", [&](auto& b) { Put<uint32_t>(b, lo.block_count_value, 0); }},
      {"block_count = 4294967295", [&](auto& b) { Put<uint32_t>(b, lo.block_count_value, 0xFFFFFFFFu); }},
      // Found by review while writing fuzz/gguf_fuzz, reproduced with it: 2^30 blocks were allocated
      // (160 GB, std::bad_alloc) before any block's tensors were looked up.
      {"block_count = 1073741824 needs at least 9 tensors per block; the file has 20",
       [&](auto& b) { Put<uint32_t>(b, lo.block_count_value, 1u << 30); }},
      {"dimension count 5", [&](auto& b) { Put<uint32_t>(b, lo.first_tensor_ndims, 5); }},
      {"dimension count 0", [&](auto& b) { Put<uint32_t>(b, lo.first_tensor_ndims, 0); }},
      {"dim 0 = 0", [&](auto& b) { Put<uint64_t>(b, lo.first_tensor_dim0, 0); }},
      {"out of range", [&](auto& b) { Put<uint64_t>(b, lo.first_tensor_dim0, 1ull << 50); }},
      {"not a multiple of Q8_0", [&](auto& b) { Put<uint64_t>(b, lo.first_tensor_dim0, 48); }},
      {"tensor type 6 is not supported", [&](auto& b) { Put<uint32_t>(b, lo.first_tensor_type, 6); }},
      {"tensor type 4000", [&](auto& b) { Put<uint32_t>(b, lo.first_tensor_type, 4000); }},
      {"not aligned", [&](auto& b) { Put<uint64_t>(b, lo.first_tensor_offset, 3); }},
      {"runs past the end", [&](auto& b) { Put<uint64_t>(b, lo.first_tensor_offset, 1ull << 40); }},
      {"runs past the end", [&](auto& b) { Put<uint64_t>(b, lo.first_tensor_offset, ~0ull - 31); }},
      {"vocab_size = 32 but token_embd.weight has 16 rows",
       [&](auto& b) { Put<uint64_t>(b, lo.first_tensor_dim0 + 8, 16); }},
      {"architecture 'gpt9!'", [&](auto& b) { std::memcpy(b.data() + lo.first_key_len + 8 + 20 + 4 + 8, "gpt9!", 5); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<uint8_t> b = good;
    c.corrupt(b);
    ExpectError(b, c.what);
  }
}

TEST_F(GgufTest, MissingTensorsAndNonFiniteNormsAreRefused) {
  Layout lo;
  std::vector<uint8_t> b = TinyGguf(&lo);
  // Rename the first tensor (token_embd.weight -> token_embd.weighX).
  const size_t name_at = lo.first_tensor_ndims - 1;
  b[name_at] = 'X';
  ExpectError(b, "token_embd.weight is missing");
  // A NaN in output_norm (the second tensor's data, right after the embedding's 32-aligned blocks).
  b = TinyGguf(&lo);
  const size_t embd_bytes = (kVocab * kDim / kQK * sizeof(BlockQ8_0) + 31) / 32 * 32;
  Put<float>(b, lo.data_start + embd_bytes + 4, std::nanf(""));
  ExpectError(b, "norm or bias holds nan");
}

TEST_F(GgufTest, DuplicateKeysAndTensorsAreRefused) {
  Writer w;
  w.U32(0x46554747);
  w.U32(2);
  w.U64(0);
  w.U64(2);
  for (int i = 0; i < 2; ++i) {
    w.Str("general.architecture");
    w.U32(8);
    w.Str("llama");
  }
  ExpectError(w.bytes(), "general.architecture at byte");
  ExpectError(w.bytes(), "duplicate metadata key");
  Writer t;
  t.U32(0x46554747);
  t.U32(3);
  t.U64(2);
  t.U64(0);
  for (int i = 0; i < 2; ++i) {
    t.Str("a.weight");
    t.U32(1);
    t.U64(8);
    t.U32(0);
    t.U64(0);
  }
  t.bytes().resize(256, 0);
  auto f = GgufFile::Open(Write(t.bytes()));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("tensor 'a.weight' appears twice"), std::string::npos) << f.status();
}

TEST_F(GgufTest, RandomByteFlipsNeverCrash) {
  const std::vector<uint8_t> good = TinyGguf();
  Layout lo;
  TinyGguf(&lo);
  std::mt19937 rng(7);
  int loaded = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {  // bounded: ~1 s, longer under ASan
    std::vector<uint8_t> b = good;
    for (int f = 0; f < 4; ++f) b[rng() % lo.data_start] ^= static_cast<uint8_t>(1u << (rng() % 8));
    auto w = LoadGguf(Write(b));
    (w.ok() ? loaded : refused) += 1;
  }
  EXPECT_GT(refused, 100);  // most flips in the header break something and are reported
}

}  // namespace
}  // namespace specula

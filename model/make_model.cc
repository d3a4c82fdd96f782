#include "model/make_model.h"

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

struct Shape {
  const char* name;
  ModelConfig config;
};

ModelConfig Make(int32_t dim, int32_t hidden, int32_t layers, int32_t heads, int32_t kv,
                 int32_t vocab, int32_t seq, float theta, bool tied) {
  ModelConfig c;
  c.dim = dim;
  c.hidden_dim = hidden;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv;
  c.head_dim = dim / heads;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.rope_theta = theta;
  c.tie_embeddings = tied;
  c.norm_eps = 1e-5f;
  return c;
}

std::vector<Shape> Shapes() {
  ModelConfig l32 = Make(2048, 8192, 16, 32, 8, 128256, 131072, 500000.0f, true);
  l32.rope_scaling = {"llama3", 32.0f, 1.0f, 4.0f, 8192};
  return {
      {"tiny", Make(64, 176, 2, 4, 2, 512, 512, 10000.0f, false)},
      {"stories15m", Make(288, 768, 6, 6, 6, 32000, 256, 10000.0f, true)},
      {"stories110m", Make(768, 2048, 12, 12, 12, 32000, 1024, 10000.0f, true)},
      {"smollm2-135m", Make(576, 1536, 30, 9, 3, 49152, 8192, 100000.0f, true)},
      {"llama-3.2-1b", l32},
      {"llama-3-8b", Make(4096, 14336, 32, 32, 8, 128256, 8192, 500000.0f, false)},
  };
}

// splitmix64: fast and good enough for dummy weights.
uint64_t Mix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void FillUniform(float* out, int64_t n, float mean, float std, uint64_t seed) {
  const float half_width = std * std::sqrt(3.0f);
  uint64_t s = seed;
  for (int64_t i = 0; i < n; ++i) {
    const float u = static_cast<float>((Mix(s) >> 40) * (1.0 / (1ull << 24)));  // [0, 1)
    float v = mean + (2.0f * u - 1.0f) * half_width;
    if (v == 0.0f) v = std * 1e-3f;  // never an exact zero
    out[i] = v;
  }
}

// GPT-2's reversible map from bytes to printable code points, as UTF-8: the byte symbols of a
// byte-level vocabulary. The tokenizers' copy, ByteToUnicode (tokenizer/pretokenize.h), is out of
// model/'s reach (core/, kernels/ and dist/ only); MakeModelTest checks that the tokenizer.json
// written here decodes every byte.
std::vector<std::string> ByteSymbols() {
  std::vector<std::string> m(256);
  int32_t n = 0;
  for (int32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const int32_t cp = printable ? b : 256 + n++;  // below U+0800: one or two bytes
    m[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                     : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
  }
  return m;
}

// A byte-level tokenizer.json covering `vocab` ids: 256 byte symbols, filler pieces, and
// BOS/EOS as the last two ids.
std::string ByteLevelTokenizerJson(int32_t vocab) {
  using json = nlohmann::json;
  json v = json::object();
  int32_t n = 0;
  const std::vector<std::string> bytes = ByteSymbols();
  for (; n < 256 && n < vocab - 2; ++n) v[bytes[n]] = n;
  for (; n < vocab - 2; ++n) v[absl::StrCat("<|filler_", n, "|>")] = n;
  json added = json::array();
  added.push_back({{"id", vocab - 2}, {"content", "<|begin_of_text|>"}, {"special", true}});
  added.push_back({{"id", vocab - 1}, {"content", "<|end_of_text|>"}, {"special", true}});
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"vocab", v}, {"merges", json::array()}}}};
  return j.dump();
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> NamedShapes() {
  std::vector<std::string> names;
  for (const auto& s : Shapes()) names.push_back(s.name);
  return names;
}

absl::StatusOr<ModelConfig> NamedShape(const std::string& name) {
  for (const auto& s : Shapes()) {
    if (name == s.name) return s.config;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown shape '", name, "'; known shapes: ",
                                                 absl::StrJoin(NamedShapes(), ", ")));
}

absl::Status WriteRandomModel(const ModelConfig& config, const std::string& dir, DType dtype,
                              uint64_t seed) {
  ModelConfig c = config;
  RETURN_IF_ERROR(ValidateConfig(c, "make-model shape"));
  if (c.vocab_size < 3) return absl::InvalidArgumentError("make-model: vocab must be at least 3");
  c.bos_token_id = c.vocab_size - 2;
  c.eos_token_ids = {c.vocab_size - 1};
  std::error_code ec;  // parents too, as `mkdir -p`: a failure shows in the check below
  std::filesystem::create_directories(dir, ec);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create the output directory"));
  }
  // (name, shape, kind) where kind: 0 linear (std 1/sqrt(fan_in)), 1 embedding, 2 norm, 3 bias.
  struct Spec {
    TensorSpec t;
    int kind;
  };
  std::vector<Spec> specs;
  const int64_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), h = c.hidden_dim, v = c.vocab_size;
  specs.push_back({{"model.embed_tokens.weight", {v, d}}, 1});
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    specs.push_back({{p + "input_layernorm.weight", {d}}, 2});
    specs.push_back({{p + "self_attn.q_proj.weight", {q, d}}, 0});
    specs.push_back({{p + "self_attn.k_proj.weight", {kv, d}}, 0});
    specs.push_back({{p + "self_attn.v_proj.weight", {kv, d}}, 0});
    if (c.qkv_bias) {
      specs.push_back({{p + "self_attn.q_proj.bias", {q}}, 3});
      specs.push_back({{p + "self_attn.k_proj.bias", {kv}}, 3});
      specs.push_back({{p + "self_attn.v_proj.bias", {kv}}, 3});
    }
    specs.push_back({{p + "self_attn.o_proj.weight", {d, q}}, 0});
    specs.push_back({{p + "post_attention_layernorm.weight", {d}}, 2});
    specs.push_back({{p + "mlp.gate_proj.weight", {h, d}}, 0});
    specs.push_back({{p + "mlp.up_proj.weight", {h, d}}, 0});
    specs.push_back({{p + "mlp.down_proj.weight", {d, h}}, 0});
  }
  specs.push_back({{"model.norm.weight", {d}}, 2});
  if (!c.tie_embeddings) specs.push_back({{"lm_head.weight", {v, d}}, 0});

  std::vector<TensorSpec> tensors;
  for (const auto& s : specs) tensors.push_back(s.t);
  auto fill = [&](size_t i, float* out) {
    const Spec& s = specs[i];
    const int64_t n = s.t.NumElements();
    const uint64_t tseed = seed * 0x100000001b3ull + i * 0x9e3779b97f4a7c15ull + 1;
    switch (s.kind) {
      case 0: FillUniform(out, n, 0.0f, 1.0f / std::sqrt(static_cast<float>(s.t.shape[1])), tseed); break;
      case 1: FillUniform(out, n, 0.0f, 0.1f, tseed); break;
      case 2: FillUniform(out, n, 1.0f, 0.05f, tseed); break;
      default: FillUniform(out, n, 0.0f, 0.02f, tseed); break;
    }
  };
  const char* torch_dtype = dtype == DType::kF32 ? "float32" : dtype == DType::kF16 ? "float16" : "bfloat16";
  RETURN_IF_ERROR(WriteText(dir + "/config.json", HfConfigJson(c, torch_dtype)));
  RETURN_IF_ERROR(WriteText(dir + "/tokenizer.json", ByteLevelTokenizerJson(c.vocab_size)));
  RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors, dtype, fill));
  return absl::OkStatus();
}

}  // namespace specula

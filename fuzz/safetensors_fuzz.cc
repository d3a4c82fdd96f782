// HF safetensors checkpoints (model/safetensors.cc SafetensorsFile::Open, model/weights.cc
// LoadHfModel): the 8-byte header length, the JSON header of {name: {dtype, shape, data_offsets}},
// and the binding of tensors to a fixed small config.json. An input that starts with '{' is a
// model.safetensors.index.json instead, over two fixed shards written at start.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace {

// The config.json of both directories: 2 layers, GQA 2:1, untied classifier (the seeds that
// fuzz/make_seeds.py writes have this shape).
constexpr char kConfig[] = R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
  "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16,
  "max_position_embeddings": 32, "tie_word_embeddings": false})";

std::vector<specula::TensorSpec> Tensors(int layer_begin, int layer_end, bool globals) {
  std::vector<specula::TensorSpec> t;
  if (globals) {
    t.push_back({"model.embed_tokens.weight", {16, 8}});
    t.push_back({"model.norm.weight", {8}});
    t.push_back({"lm_head.weight", {16, 8}});
  }
  for (int i = layer_begin; i < layer_end; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {8}});
    t.push_back({p + "self_attn.q_proj.weight", {8, 8}});
    t.push_back({p + "self_attn.k_proj.weight", {4, 8}});
    t.push_back({p + "self_attn.v_proj.weight", {4, 8}});
    t.push_back({p + "self_attn.o_proj.weight", {8, 8}});
    t.push_back({p + "post_attention_layernorm.weight", {8}});
    t.push_back({p + "mlp.gate_proj.weight", {16, 8}});
    t.push_back({p + "mlp.up_proj.weight", {16, 8}});
    t.push_back({p + "mlp.down_proj.weight", {8, 16}});
  }
  return t;
}

struct Dirs {
  std::string single;   // config.json + model.safetensors (the input)
  std::string sharded;  // config.json + two shards + model.safetensors.index.json (the input)
};

const Dirs& Setup() {
  static const Dirs* dirs = [] {
    namespace fz = specula::fuzz;
    auto* d = new Dirs{fz::ScratchDir() + "/single", fz::ScratchDir() + "/sharded"};
    for (const std::string& dir : {d->single, d->sharded}) {
      std::filesystem::create_directories(dir);
      fz::WriteFile(dir + "/config.json", kConfig);
    }
    auto fill = [](size_t, float* out) { out[0] = 1.0f; };
    for (auto [name, dtype, begin, end, globals] :
         {std::tuple{"model-00001-of-00002.safetensors", specula::DType::kBF16, 0, 1, true},
          std::tuple{"model-00002-of-00002.safetensors", specula::DType::kF32, 1, 2, false}}) {
      if (auto st = specula::WriteSafetensors(d->sharded + "/" + name, Tensors(begin, end, globals), dtype, fill);
          !st.ok()) {
        fz::SetupFailed(std::string(st.message()));
      }
    }
    return d;
  }();
  return *dirs;
}

float Touch(const float* p, int64_t n) { return p != nullptr && n > 0 ? p[0] + p[n - 1] : 0.0f; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Dirs& dirs = Setup();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const bool index = size > 0 && data[0] == '{';
  const std::string dir = index ? dirs.sharded : dirs.single;
  specula::fuzz::WriteFile(dir + (index ? "/model.safetensors.index.json" : "/model.safetensors"), bytes);
  if (!index) {
    // The file alone, as every shard is opened: each entry's bytes must lie in the mapping.
    if (auto f = specula::SafetensorsFile::Open(dir + "/model.safetensors"); f.ok()) {
      volatile uint8_t sink = 0;
      for (const auto& [name, e] : f->tensors()) {
        if (e.num_bytes > 0) sink = sink + e.data[0] + e.data[e.num_bytes - 1];
      }
    }
  }
  auto w = specula::LoadHfModel(dir);
  if (!w.ok()) return 0;
  const specula::ModelConfig& c = (*w)->config;
  volatile float sink = 0.0f;
  const int64_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), h = c.hidden_dim, v = c.vocab_size;
  sink = sink + Touch((*w)->embed.f32(), v * d) + Touch((*w)->final_norm, d) + Touch((*w)->lm_head.f32(), v * d);
  for (const specula::LayerWeights& l : (*w)->layers) {
    sink = sink + Touch(l.attn_norm, d) + Touch(l.wq.f32(), q * d) + Touch(l.wk.f32(), kv * d) +
           Touch(l.wv.f32(), kv * d) + Touch(l.wo.f32(), d * q) + Touch(l.ffn_norm, d) +
           Touch(l.w_gate.f32(), h * d) + Touch(l.w_up.f32(), h * d) + Touch(l.w_down.f32(), d * h);
  }
  return 0;
}

#include "model/weights.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::json;

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsGgufFile(const std::string& path) {
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

// Fills `w.layers` etc. from a name -> float view lookup. `get(name, shape)` fails with the tensor
// name when it is missing or has the wrong shape.
template <typename Get>
absl::Status BindHfTensors(ModelWeights& w, Get get) {
  const ModelConfig& c = w.config;
  const int64_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), h = c.hidden_dim, v = c.vocab_size;
  ASSIGN_OR_RETURN(w.embed, get("model.embed_tokens.weight", {v, d}, false));
  ASSIGN_OR_RETURN(w.final_norm, get("model.norm.weight", {d}, false));
  ASSIGN_OR_RETURN(w.lm_head, get("lm_head.weight", {v, d}, c.tie_embeddings));
  if (w.lm_head == nullptr) w.lm_head = w.embed;
  w.layers.resize(c.num_layers);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerWeights& l = w.layers[i];
    ASSIGN_OR_RETURN(l.attn_norm, get(p + "input_layernorm.weight", {d}, false));
    ASSIGN_OR_RETURN(l.wq, get(p + "self_attn.q_proj.weight", {q, d}, false));
    ASSIGN_OR_RETURN(l.wk, get(p + "self_attn.k_proj.weight", {kv, d}, false));
    ASSIGN_OR_RETURN(l.wv, get(p + "self_attn.v_proj.weight", {kv, d}, false));
    if (c.qkv_bias) {
      ASSIGN_OR_RETURN(l.bq, get(p + "self_attn.q_proj.bias", {q}, false));
      ASSIGN_OR_RETURN(l.bk, get(p + "self_attn.k_proj.bias", {kv}, false));
      ASSIGN_OR_RETURN(l.bv, get(p + "self_attn.v_proj.bias", {kv}, false));
    }
    ASSIGN_OR_RETURN(l.wo, get(p + "self_attn.o_proj.weight", {d, q}, false));
    ASSIGN_OR_RETURN(l.ffn_norm, get(p + "post_attention_layernorm.weight", {d}, false));
    ASSIGN_OR_RETURN(l.w_gate, get(p + "mlp.gate_proj.weight", {h, d}, false));
    ASSIGN_OR_RETURN(l.w_up, get(p + "mlp.up_proj.weight", {h, d}, false));
    ASSIGN_OR_RETURN(l.w_down, get(p + "mlp.down_proj.weight", {d, h}, false));
  }
  return absl::OkStatus();
}

}  // namespace

void ModelWeights::Release(const void* p, size_t bytes) {
  for (const MappedFile& f : files) {
    if (f.Release(p, bytes)) return;
  }
  for (std::vector<float>& v : owned) {
    if (static_cast<const void*>(v.data()) == p) return std::vector<float>().swap(v);
  }
  for (std::vector<uint8_t>& v : owned_blocks) {
    if (static_cast<const void*>(v.data()) == p) return std::vector<uint8_t>().swap(v);
  }
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlama2c(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": bad llama2.c checkpoint: ", why));
  };
  if (file.size() < 7 * sizeof(int32_t)) {
    return bad(absl::StrCat("file has ", file.size(), " bytes, less than the 28-byte header"));
  }
  int32_t h[7];  // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
  std::memcpy(h, file.data(), sizeof(h));
  auto w = std::make_unique<ModelWeights>();
  ModelConfig& c = w->config;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.num_layers = h[2];
  c.num_heads = h[3];
  c.num_kv_heads = h[4];
  c.tie_embeddings = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : -static_cast<int64_t>(h[5]) > INT32_MAX ? 0 : -h[5];
  c.max_seq_len = h[6];
  c.head_dim = c.num_heads > 0 ? c.dim / c.num_heads : 0;
  c.rope_interleaved = true;  // llama2.c rotates adjacent pairs
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  c.bos_token_id = 1;
  // EOS, and BOS: llama2.c's models mark the end of a story with BOS (run.c stops there).
  c.eos_token_ids = {2, 1};
  if (c.num_heads > 0 && c.dim % c.num_heads != 0) {
    return bad(absl::StrCat("header dim ", c.dim, " is not a multiple of n_heads ", c.num_heads));
  }
  RETURN_IF_ERROR(ValidateConfig(c, path + " header"));
  for (int32_t v : h) {
    if (v > (1 << 24) || v < -(1 << 24)) return bad(absl::StrCat("implausible header value ", v));
  }
  const int64_t d = c.dim, kv = c.kv_dim(), hid = c.hidden_dim, L = c.num_layers,
                v = c.vocab_size, hs = c.head_dim;
  const int64_t floats = v * d + L * d + L * d * d + 2 * L * d * kv + L * d * d + L * d +
                         2 * L * d * hid + L * hid * d + d + c.max_seq_len * hs +
                         (c.tie_embeddings ? 0 : v * d);
  const int64_t expected = 28 + floats * 4;
  if (static_cast<int64_t>(file.size()) != expected) {
    return bad(absl::StrCat("header (dim ", d, ", layers ", L, ", vocab ", v, ") implies ",
                            expected, " bytes but the file has ", file.size(),
                            " (truncated or corrupted)"));
  }
  const float* p = reinterpret_cast<const float*>(file.data() + 28);
  auto take = [&p](int64_t n) {
    const float* r = p;
    p += n;
    return r;
  };
  w->embed = take(v * d);
  w->layers.resize(L);
  const float* rms_att = take(L * d);
  const float* wq = take(L * d * d);
  const float* wk = take(L * kv * d);
  const float* wv = take(L * kv * d);
  const float* wo = take(L * d * d);
  const float* rms_ffn = take(L * d);
  const float* w1 = take(L * hid * d);
  const float* w2 = take(L * d * hid);
  const float* w3 = take(L * hid * d);
  for (int64_t i = 0; i < L; ++i) {
    LayerWeights& l = w->layers[i];
    l.attn_norm = rms_att + i * d;
    l.wq = wq + i * d * d;
    l.wk = wk + i * kv * d;
    l.wv = wv + i * kv * d;
    l.wo = wo + i * d * d;
    l.ffn_norm = rms_ffn + i * d;
    l.w_gate = w1 + i * hid * d;
    l.w_down = w2 + i * d * hid;
    l.w_up = w3 + i * hid * d;
  }
  w->final_norm = take(d);
  take(c.max_seq_len * hs);  // freq_cis_real and freq_cis_imag, recomputed instead
  w->lm_head = c.tie_embeddings ? w->embed : take(v * d);
  w->files.push_back(std::move(file));
  return w;
}

namespace {

// The safetensors files of an HF checkpoint directory: model.safetensors, or the shards that
// model.safetensors.index.json names (each once, in the index's order, all inside `dir`).
absl::StatusOr<std::vector<std::string>> SafetensorsShards(const std::string& dir) {
  std::vector<std::string> shard_paths;
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (IsFile(single)) {
    shard_paths.push_back(single);
  } else if (IsFile(index_path)) {
    ASSIGN_OR_RETURN(std::string index_text, ReadTextFile(index_path));
    json index = json::parse(index_text, nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": field 'weight_map' is missing or not an object"));
    }
    std::map<std::string, bool> seen;
    for (auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map entry '", name, "' must be a file name"));
      }
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map entry '", name, "' names a path outside ", dir));
      }
      if (!seen[f]) shard_paths.push_back(dir + "/" + f);
      seen[f] = true;
    }
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json"));
  }
  return shard_paths;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHfModel(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string config_text, ReadTextFile(config_path));
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(w->config, ParseHfConfig(config_text, config_path));

  ASSIGN_OR_RETURN(const std::vector<std::string> shard_paths, SafetensorsShards(dir));

  std::map<std::string, std::pair<TensorEntry, std::string>> entries;  // name -> (entry, file)
  for (const auto& sp : shard_paths) {
    ASSIGN_OR_RETURN(SafetensorsFile st, SafetensorsFile::Open(sp));
    for (const auto& [name, e] : st.tensors()) entries.emplace(name, std::pair{e, sp});
    w->files.push_back(st.TakeFile());
  }

  // Each layer has at least 9 tensors: a layer count the checkpoint cannot hold is refused before
  // the layers are allocated.
  if (static_cast<size_t>(w->config.num_layers) > entries.size() / 9) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": field 'num_hidden_layers' (", w->config.num_layers,
                                                   ") needs at least 9 tensors per layer; the checkpoint has ",
                                                   entries.size()));
  }
  ModelWeights* wp = w.get();
  auto get = [&](const std::string& name, std::vector<int64_t> shape,
                 bool optional) -> absl::StatusOr<const float*> {
    auto it = entries.find(name);
    if (it == entries.end()) {
      if (optional) return nullptr;
      return absl::NotFoundError(absl::StrCat(dir, ": tensor '", name, "' is missing"));
    }
    const TensorEntry& e = it->second.first;
    if (e.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          it->second.second, ": tensor '", name, "' has shape [", absl::StrJoin(e.shape, ", "),
          "] but config.json implies [", absl::StrJoin(shape, ", "), "]"));
    }
    const int64_t n = e.num_bytes / DTypeBytes(e.dtype);
    if (e.dtype == DType::kF32 && reinterpret_cast<uintptr_t>(e.data) % alignof(float) == 0) {
      return reinterpret_cast<const float*>(e.data);  // mapped, zero-copy
    }
    std::vector<float>& out = wp->owned.emplace_back(n);  // [numel]
    if (e.dtype == DType::kF32) {
      std::memcpy(out.data(), e.data, n * 4);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, e.data + 2 * i, 2);
        out[i] = e.dtype == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
      }
    }
    return static_cast<const float*>(out.data());
  };
  RETURN_IF_ERROR(BindHfTensors(*w, get));
  return w;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& path) {
  if (IsDirectory(path)) return LoadHfModel(path);
  if (!IsFile(path)) return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  if (IsGgufFile(path)) return LoadGguf(path);
  return LoadLlama2c(path);
}

}  // namespace specula

// GGUF models of the Llama family: config from `{arch}.*` metadata, tensors bound by llama.cpp's
// names. Matrices stay in their blocks, in the mapping; norms and biases become float32.
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/gguf.h"
#include "core/status_macros.h"
#include "model/weights.h"

namespace specula {
namespace {

// GGUF's llama converter permutes Q/K rows so that RoPE rotates adjacent pairs (as llama2.c);
// qwen2 files keep HF's layout and rotate halves (llama.cpp's NEOX rope type).
bool RopeInterleaved(std::string_view arch) { return arch != "qwen2"; }

absl::StatusOr<ModelConfig> ReadConfig(const GgufFile& f, std::string_view arch) {
  const std::string a(arch);
  ModelConfig c;
  auto get_int = [&](const std::string& key, int32_t* out, bool required) -> absl::Status {
    absl::StatusOr<int64_t> v = f.GetInt(a + "." + key);
    if (!v.ok()) return required || !absl::IsNotFound(v.status()) ? v.status() : absl::OkStatus();
    if (*v <= 0 || *v > (1 << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": GGUF metadata ", a, ".", key, " = ", *v,
                                                      " is out of range"));
    }
    *out = static_cast<int32_t>(*v);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(get_int("block_count", &c.num_layers, true));
  RETURN_IF_ERROR(get_int("embedding_length", &c.dim, true));
  RETURN_IF_ERROR(get_int("feed_forward_length", &c.hidden_dim, true));
  RETURN_IF_ERROR(get_int("attention.head_count", &c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  RETURN_IF_ERROR(get_int("attention.head_count_kv", &c.num_kv_heads, false));
  RETURN_IF_ERROR(get_int("context_length", &c.max_seq_len, true));
  c.head_dim = c.dim / c.num_heads;
  RETURN_IF_ERROR(get_int("attention.key_length", &c.head_dim, false));
  int32_t rope_dims = c.head_dim;
  RETURN_IF_ERROR(get_int("rope.dimension_count", &rope_dims, false));
  if (rope_dims != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": GGUF metadata ", a, ".rope.dimension_count = ",
                                                   rope_dims, " (partial RoPE) is not supported; head dim is ",
                                                   c.head_dim));
  }
  if (auto v = f.GetFloat(a + ".rope.freq_base"); v.ok()) {
    c.rope_theta = static_cast<float>(*v);
  } else if (!absl::IsNotFound(v.status())) {
    return v.status();
  }
  if (auto v = f.GetFloat(a + ".attention.layer_norm_rms_epsilon"); v.ok()) {
    c.norm_eps = static_cast<float>(*v);
  } else {
    return v.status();
  }
  if (auto v = f.GetString(a + ".rope.scaling.type"); v.ok() && *v != "none") {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": GGUF metadata ", a, ".rope.scaling.type '",
                                                   std::string(*v), "' is not supported"));
  }
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": GGUF tensor rope_freqs.weight (Llama 3.1 RoPE "
                                                   "scaling factors) is not supported"));
  }
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return absl::NotFoundError(absl::StrCat(f.path(), ": GGUF tensor token_embd.weight is missing"));
  if (embd->dims.size() != 2 || embd->dims[1] > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": GGUF tensor token_embd.weight must be 2-D"));
  }
  c.vocab_size = static_cast<int32_t>(embd->dims[1]);
  int32_t vocab_meta = c.vocab_size;
  RETURN_IF_ERROR(get_int("vocab_size", &vocab_meta, false));
  if (vocab_meta != c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": GGUF metadata ", a, ".vocab_size = ", vocab_meta,
                                                   " but token_embd.weight has ", c.vocab_size, " rows"));
  }
  c.rope_interleaved = RopeInterleaved(arch);
  c.tie_embeddings = f.FindTensor("output.weight") == nullptr;
  c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  if (auto v = f.GetInt("tokenizer.ggml.bos_token_id"); v.ok()) c.bos_token_id = static_cast<int32_t>(*v);
  if (auto v = f.GetInt("tokenizer.ggml.eos_token_id"); v.ok()) c.eos_token_ids.push_back(static_cast<int32_t>(*v));
  if (auto v = f.GetInt("tokenizer.ggml.eot_token_id"); v.ok() && (c.eos_token_ids.empty() || *v != c.eos_token_ids[0])) {
    c.eos_token_ids.push_back(static_cast<int32_t>(*v));
  }
  RETURN_IF_ERROR(ValidateConfig(c, f.path() + " (GGUF metadata)"));
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGguf(const std::string& path) {
  ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(path));
  ASSIGN_OR_RETURN(std::string_view arch, f.GetString("general.architecture"));
  if (arch != "llama" && arch != "mistral" && arch != "qwen2") {
    return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF general.architecture '", std::string(arch),
                                                   "' is not supported (llama, mistral, qwen2)"));
  }
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(w->config, ReadConfig(f, arch));
  const ModelConfig& c = w->config;
  ModelWeights* wp = w.get();

  // The tensor `name` with GGUF dims {cols, rows} (or {n} for a vector), checked.
  auto find = [&](const std::string& name, std::vector<int64_t> dims, bool optional) -> absl::StatusOr<const GgufTensor*> {
    const GgufTensor* t = f.FindTensor(name);
    if (t == nullptr) {
      if (optional) return nullptr;
      return absl::NotFoundError(absl::StrCat(path, ": GGUF tensor ", name, " is missing"));
    }
    if (t->dims != dims) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF tensor ", name, " has dims [",
                                                     absl::StrJoin(t->dims, ", "), "] but the metadata implies [",
                                                     absl::StrJoin(dims, ", "), "]"));
    }
    return t;
  };
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, bool optional = false) -> absl::StatusOr<Matrix> {
    ASSIGN_OR_RETURN(const GgufTensor* t, find(name, {cols, rows}, optional));
    if (t == nullptr) return Matrix();
    return Matrix(t->data, t->type);
  };
  auto vec = [&](const std::string& name, int64_t n, bool optional = false) -> absl::StatusOr<const float*> {
    ASSIGN_OR_RETURN(const GgufTensor* t, find(name, {n}, optional));
    if (t == nullptr) return nullptr;
    std::vector<float>& out = wp->owned.emplace_back(n);  // [n]
    DequantizeRow(t->type, t->data, n, out.data());  // aligned float32 whatever the file's offsets
    return static_cast<const float*>(out.data());
  };

  // Each block has at least 9 tensors: a block count the file cannot hold is refused before the
  // layers are allocated.
  if (static_cast<uint64_t>(c.num_layers) > f.tensors().size() / 9) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF metadata ", std::string(arch), ".block_count = ",
                                                   c.num_layers, " needs at least 9 tensors per block; the file has ",
                                                   f.tensors().size()));
  }
  const int64_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), h = c.hidden_dim, v = c.vocab_size;
  ASSIGN_OR_RETURN(w->embed, matrix("token_embd.weight", v, d));
  ASSIGN_OR_RETURN(w->final_norm, vec("output_norm.weight", d));
  ASSIGN_OR_RETURN(w->lm_head, matrix("output.weight", v, d, /*optional=*/true));
  if (w->lm_head.data == nullptr) w->lm_head = w->embed;
  w->layers.resize(c.num_layers);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    LayerWeights& l = w->layers[i];
    ASSIGN_OR_RETURN(l.attn_norm, vec(p + "attn_norm.weight", d));
    ASSIGN_OR_RETURN(l.wq, matrix(p + "attn_q.weight", q, d));
    ASSIGN_OR_RETURN(l.wk, matrix(p + "attn_k.weight", kv, d));
    ASSIGN_OR_RETURN(l.wv, matrix(p + "attn_v.weight", kv, d));
    if (c.qkv_bias) {
      ASSIGN_OR_RETURN(l.bq, vec(p + "attn_q.bias", q));
      ASSIGN_OR_RETURN(l.bk, vec(p + "attn_k.bias", kv));
      ASSIGN_OR_RETURN(l.bv, vec(p + "attn_v.bias", kv));
    }
    ASSIGN_OR_RETURN(l.wo, matrix(p + "attn_output.weight", d, q));
    ASSIGN_OR_RETURN(l.ffn_norm, vec(p + "ffn_norm.weight", d));
    ASSIGN_OR_RETURN(l.w_gate, matrix(p + "ffn_gate.weight", h, d));
    ASSIGN_OR_RETURN(l.w_up, matrix(p + "ffn_up.weight", h, d));
    ASSIGN_OR_RETURN(l.w_down, matrix(p + "ffn_down.weight", d, h));
  }
  // Bad values in the blocks' scales would turn into NaN logits: refuse non-finite norms here
  // (cheap), and leave the matrices to the parity tests.
  for (const std::vector<float>& o : w->owned) {
    for (float x : o) {
      if (!std::isfinite(x)) return absl::InvalidArgumentError(absl::StrCat(path, ": GGUF norm or bias holds ", x));
    }
  }
  w->files.push_back(f.TakeFile());
  return w;
}

}  // namespace specula

#include "model/model_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::json;

absl::Status FieldError(const std::string& path, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": field '", field, "' ", why));
}

// Reads an integer field; `required` decides whether a missing field is an error.
absl::Status GetInt(const json& j, const std::string& path, const char* field, bool required,
                    int32_t* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    return required ? FieldError(path, field, "is missing") : absl::OkStatus();
  }
  if (!it->is_number_integer()) return FieldError(path, field, "must be an integer");
  const int64_t v = it->get<int64_t>();
  if (v < INT32_MIN || v > INT32_MAX) return FieldError(path, field, "is out of range");
  *out = static_cast<int32_t>(v);
  return absl::OkStatus();
}

absl::Status GetFloat(const json& j, const std::string& path, const char* field, float* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return FieldError(path, field, "must be a number");
  *out = it->get<float>();
  return absl::OkStatus();
}

absl::Status GetBool(const json& j, const std::string& path, const char* field, bool* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return FieldError(path, field, "must be true or false");
  *out = it->get<bool>();
  return absl::OkStatus();
}

}  // namespace

int64_t ModelConfig::NumParams() const {
  const int64_t d = dim;
  const int64_t per_layer = 2 * d + d * q_dim() + 2 * d * kv_dim() + q_dim() * d +
                            3 * d * hidden_dim + (qkv_bias ? q_dim() + 2 * kv_dim() : 0);
  return static_cast<int64_t>(vocab_size) * d * (tie_embeddings ? 1 : 2) + d +
         per_layer * num_layers;
}

absl::Status ValidateConfig(const ModelConfig& c, const std::string& source) {
  auto positive = [&](int32_t v, const char* field) -> absl::Status {
    if (v <= 0) return FieldError(source, field, absl::StrCat("must be positive, got ", v));
    return absl::OkStatus();
  };
  for (auto [v, name] : {std::pair{c.dim, "hidden_size"}, {c.hidden_dim, "intermediate_size"},
                         {c.num_layers, "num_hidden_layers"}, {c.num_heads, "num_attention_heads"},
                         {c.num_kv_heads, "num_key_value_heads"}, {c.head_dim, "head_dim"},
                         {c.vocab_size, "vocab_size"}, {c.max_seq_len, "max_position_embeddings"}}) {
    if (auto st = positive(v, name); !st.ok()) return st;
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return FieldError(source, "num_key_value_heads",
                      absl::StrCat("(", c.num_kv_heads, ") must divide num_attention_heads (",
                                   c.num_heads, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return FieldError(source, "head_dim", absl::StrCat("must be even for RoPE, got ", c.head_dim));
  }
  // The sizes computed from these must fit their types: q_dim() and kv_dim() in int32, the weight
  // counts (NumParams(), the loaders' tensor sizes) in int64. Real models are far below both.
  if (const int64_t q = int64_t{c.num_heads} * c.head_dim; q > INT32_MAX) {
    return FieldError(source, "head_dim", absl::StrCat("(", c.head_dim, ") times num_attention_heads (", c.num_heads,
                                                       ") is ", q, ", more than 2^31 - 1"));
  }
  const double d = c.dim, q = c.q_dim(), kv = c.kv_dim();
  const double params = c.vocab_size * d * 2 + d +
                        c.num_layers * (2 * d + 2 * d * q + 2 * d * kv + 3 * d * c.hidden_dim + q + 2 * kv);
  if (params > 1e15) {
    return FieldError(source, "hidden_size", absl::StrCat("and the other sizes imply ", params,
                                                          " parameters, implausibly many (at most 1e15)"));
  }
  if (!(c.norm_eps > 0.0f) || !std::isfinite(c.norm_eps)) {
    return FieldError(source, "rms_norm_eps", "must be positive and finite");
  }
  if (!(c.rope_theta > 0.0f) || !std::isfinite(c.rope_theta)) {
    return FieldError(source, "rope_theta", "must be positive and finite");
  }
  if (!c.rope_scaling.type.empty() && c.rope_scaling.type != "llama3") {
    return FieldError(source, "rope_scaling.rope_type",
                      absl::StrCat("'", c.rope_scaling.type, "' is not supported (only llama3)"));
  }
  for (int32_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return FieldError(source, "eos_token_id", absl::StrCat(id, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& path) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid JSON object"));
  }
  std::string model_type;
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return FieldError(path, "model_type", "must be a string");
    model_type = it->get<std::string>();
    if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2") {
      return FieldError(path, "model_type", absl::StrCat("'", model_type, "' is not a Llama-family model"));
    }
  }
  ModelConfig c;
  absl::Status st;
  if (!(st = GetInt(j, path, "hidden_size", true, &c.dim)).ok()) return st;
  if (!(st = GetInt(j, path, "intermediate_size", true, &c.hidden_dim)).ok()) return st;
  if (!(st = GetInt(j, path, "num_hidden_layers", true, &c.num_layers)).ok()) return st;
  if (!(st = GetInt(j, path, "num_attention_heads", true, &c.num_heads)).ok()) return st;
  if (!(st = GetInt(j, path, "vocab_size", true, &c.vocab_size)).ok()) return st;
  c.num_kv_heads = c.num_heads;
  if (!(st = GetInt(j, path, "num_key_value_heads", false, &c.num_kv_heads)).ok()) return st;
  if (c.num_heads > 0 && c.dim % c.num_heads == 0) c.head_dim = c.dim / c.num_heads;
  if (!(st = GetInt(j, path, "head_dim", false, &c.head_dim)).ok()) return st;
  if (c.head_dim == 0) {
    return FieldError(path, "hidden_size", "must be a multiple of num_attention_heads");
  }
  c.max_seq_len = 2048;
  if (!(st = GetInt(j, path, "max_position_embeddings", false, &c.max_seq_len)).ok()) return st;
  if (!(st = GetFloat(j, path, "rms_norm_eps", &c.norm_eps)).ok()) return st;
  if (!(st = GetFloat(j, path, "rope_theta", &c.rope_theta)).ok()) return st;
  if (!(st = GetBool(j, path, "tie_word_embeddings", &c.tie_embeddings)).ok()) return st;
  c.qkv_bias = model_type == "qwen2";
  if (!(st = GetBool(j, path, "attention_bias", &c.qkv_bias)).ok()) return st;
  if (!(st = GetBool(j, path, "rope_interleaved", &c.rope_interleaved)).ok()) return st;
  if (!(st = GetInt(j, path, "bos_token_id", false, &c.bos_token_id)).ok()) return st;
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    auto add = [&](const json& e) -> absl::Status {
      if (!e.is_number_integer()) return FieldError(path, "eos_token_id", "must be an integer or a list of integers");
      const bool fits = e.is_number_unsigned() ? e.get<uint64_t>() <= INT32_MAX
                                               : e.get<int64_t>() >= INT32_MIN && e.get<int64_t>() <= INT32_MAX;
      if (!fits) return FieldError(path, "eos_token_id", absl::StrCat(e.dump(), " is out of range"));  // not wrapped
      c.eos_token_ids.push_back(e.get<int32_t>());
      return absl::OkStatus();
    };
    if (it->is_array()) {
      for (const auto& e : *it) {
        if (!(st = add(e)).ok()) return st;
      }
    } else if (!(st = add(*it)).ok()) {
      return st;
    }
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return FieldError(path, "rope_scaling", "must be an object");
    const json& rs = *it;
    for (const char* key : {"rope_type", "type"}) {  // transformers' current name, then its older one
      if (auto t = rs.find(key); t != rs.end() && !t->is_null()) {
        if (!t->is_string()) return FieldError(path, absl::StrCat("rope_scaling.", key), "must be a string");
        c.rope_scaling.type = t->get<std::string>();
        break;
      }
    }
    if (c.rope_scaling.type == "default") c.rope_scaling.type.clear();
    const std::string p = path + " rope_scaling";
    if (!(st = GetFloat(rs, p, "factor", &c.rope_scaling.factor)).ok()) return st;
    if (!(st = GetFloat(rs, p, "low_freq_factor", &c.rope_scaling.low_freq_factor)).ok()) return st;
    if (!(st = GetFloat(rs, p, "high_freq_factor", &c.rope_scaling.high_freq_factor)).ok()) {
      return st;
    }
    if (!(st = GetInt(rs, p, "original_max_position_embeddings", false,
                      &c.rope_scaling.original_max_position_embeddings))
             .ok()) {
      return st;
    }
  }
  if (!(st = ValidateConfig(c, path)).ok()) return st;
  return c;
}

std::string HfConfigJson(const ModelConfig& c, const std::string& torch_dtype) {
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", c.dim},
            {"intermediate_size", c.hidden_dim},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_heads},
            {"num_key_value_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.max_seq_len},
            {"rms_norm_eps", c.norm_eps},
            {"rope_theta", c.rope_theta},
            {"tie_word_embeddings", c.tie_embeddings},
            {"attention_bias", c.qkv_bias},
            {"hidden_act", "silu"},
            {"torch_dtype", torch_dtype}};
  if (c.rope_interleaved) j["rope_interleaved"] = true;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  if (!c.rope_scaling.type.empty()) {
    j["rope_scaling"] = {
        {"rope_type", c.rope_scaling.type},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  return j.dump(2) + "\n";
}

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int32_t half = c.head_dim / 2;
  std::vector<float> inv(half);  // [head_dim / 2]
  for (int32_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(static_cast<double>(c.rope_theta), 2.0 * i / c.head_dim);
    if (c.rope_scaling.type == "llama3") {
      // Llama 3.1 scaling: long wavelengths are divided by `factor`, short ones kept, and the band
      // between is interpolated smoothly.
      const RopeScaling& s = c.rope_scaling;
      const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
      const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

}  // namespace specula

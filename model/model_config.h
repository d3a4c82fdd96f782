// Hyper-parameters of a Llama-family model, from a llama2.c header or an HF config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specula {

struct RopeScaling {
  std::string type;  // "" (none) or "llama3"
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int32_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  int32_t dim = 0;         // hidden_size
  int32_t hidden_dim = 0;  // intermediate_size (SwiGLU)
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t vocab_size = 0;
  int32_t max_seq_len = 0;  // max_position_embeddings
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool rope_interleaved = false;  // adjacent pairs (llama2.c/GGUF) vs halves (HF)
  RopeScaling rope_scaling;
  bool tie_embeddings = false;
  bool qkv_bias = false;
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  int32_t q_dim() const { return num_heads * head_dim; }
  int32_t kv_dim() const { return num_kv_heads * head_dim; }
  // Total parameter count (embedding counted once when tied).
  int64_t NumParams() const;
};

// Checks that the fields are present, positive and consistent. `source` names the file for errors.
absl::Status ValidateConfig(const ModelConfig& c, const std::string& source);

// Parses an HF config.json. Errors name `path` and the field at fault.
absl::StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& path);

// The inverse: an HF config.json for `c` (used by make-model).
std::string HfConfigJson(const ModelConfig& c, const std::string& torch_dtype);

// Per-pair inverse frequencies [head_dim / 2] with rope_theta and Llama-3 scaling applied.
std::vector<float> RopeInvFreq(const ModelConfig& c);

}  // namespace specula

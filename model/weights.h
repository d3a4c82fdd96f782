// Model weights as float32 views. Views point into memory-mapped files where the format stores
// float32 (llama2.c .bin, f32 safetensors), or into buffers converted once at load (f16, bf16).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mapped_file.h"
#include "model/model_config.h"

namespace specula {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  const float* wq = nullptr;         // [num_heads * head_dim, dim]
  const float* wk = nullptr;         // [num_kv_heads * head_dim, dim]
  const float* wv = nullptr;         // [num_kv_heads * head_dim, dim]
  const float* bq = nullptr;         // [num_heads * head_dim] or null
  const float* bk = nullptr;         // [num_kv_heads * head_dim] or null
  const float* bv = nullptr;         // [num_kv_heads * head_dim] or null
  const float* wo = nullptr;         // [dim, num_heads * head_dim]
  const float* ffn_norm = nullptr;   // [dim]
  const float* w_gate = nullptr;     // [hidden_dim, dim]
  const float* w_up = nullptr;       // [hidden_dim, dim]
  const float* w_down = nullptr;     // [dim, hidden_dim]
};

struct ModelWeights {
  ModelConfig config;
  const float* embed = nullptr;       // [vocab_size, dim]
  std::vector<LayerWeights> layers;   // [num_layers]
  const float* final_norm = nullptr;  // [dim]
  const float* lm_head = nullptr;     // [vocab_size, dim]; == embed when tied

  // Backing storage the views point into.
  std::vector<MappedFile> files;
  std::vector<std::vector<float>> owned;

  // The tensor at `p` (`n` floats) is no longer read from here (a backend copied it): its mapped
  // pages leave resident memory, or its converted buffer is freed.
  void Release(const float* p, int64_t n);
};

// llama2.c `.bin` (see ../shared/models/README.md): mapped, never copied.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlama2c(const std::string& path);

// HF directory: config.json + model.safetensors, or shards listed in model.safetensors.index.json.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHfModel(const std::string& dir);

// Picks the loader from the path: a directory is HF, a file is llama2.c.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& path);

}  // namespace specula

// Model weights as views. Vectors (norms, biases) are float32; matrices are float32 or, from GGUF,
// blocks of a quantized or 16-bit type kept as they are in the file. Views point into memory-mapped
// files where the format stores them as used, or into buffers converted once at load (f16 and bf16
// safetensors, non-f32 GGUF norms).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mapped_file.h"
#include "core/quant.h"
#include "model/model_config.h"
#include "model/tensor_parallel.h"

namespace specula {

// A weight matrix [rows, cols]: float32 rows, or rows of `type` blocks (QuantRowBytes(type, cols)
// bytes each), read in place by the backend (never dequantized at load on the CPU).
struct Matrix {
  const void* data = nullptr;
  QuantType type = QuantType::kF32;

  Matrix() = default;
  Matrix(const float* p) : data(p) {}  // NOLINT: float32 views convert implicitly
  Matrix(const void* p, QuantType t) : data(p), type(t) {}
  // The float32 view; null when the matrix is stored in another type.
  const float* f32() const { return type == QuantType::kF32 ? static_cast<const float*>(data) : nullptr; }
  bool operator==(const Matrix& o) const { return data == o.data && type == o.type; }
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  Matrix wq;         // [num_heads * head_dim, dim]
  Matrix wk;         // [num_kv_heads * head_dim, dim]
  Matrix wv;         // [num_kv_heads * head_dim, dim]
  const float* bq = nullptr;         // [num_heads * head_dim] or null
  const float* bk = nullptr;         // [num_kv_heads * head_dim] or null
  const float* bv = nullptr;         // [num_kv_heads * head_dim] or null
  Matrix wo;         // [dim, num_heads * head_dim]
  const float* ffn_norm = nullptr;   // [dim]
  Matrix w_gate;     // [hidden_dim, dim]
  Matrix w_up;       // [hidden_dim, dim]
  Matrix w_down;     // [dim, hidden_dim]
};

struct ModelWeights {
  ModelConfig config;
  Matrix embed;                       // [vocab_size, dim]
  std::vector<LayerWeights> layers;   // [num_layers]
  const float* final_norm = nullptr;  // [dim]
  Matrix lm_head;                     // [vocab_size, dim]; == embed when tied; under tensor
                                      // parallelism [shard.vocab_end - shard.vocab_begin, dim]
  TpShard shard;                      // the rank's share (ShardWeights); size 1: the whole model

  // Backing storage the views point into.
  std::vector<MappedFile> files;
  std::vector<std::vector<float>> owned;
  std::vector<std::vector<uint8_t>> owned_blocks;  // requantized matrices (self-quant drafts)

  // The tensor at `p` (`bytes` long) is no longer read from here (a backend copied it): its mapped
  // pages leave resident memory, or its converted buffer is freed.
  void Release(const void* p, size_t bytes);
};

// llama2.c `.bin` (see models/README.md): mapped, never copied.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlama2c(const std::string& path);

// HF directory: config.json + model.safetensors, or shards listed in model.safetensors.index.json.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHfModel(const std::string& dir);

// GGUF (llama, mistral and qwen2 architectures): mapped, matrices left in their blocks.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGguf(const std::string& path);

// Picks the loader from the path: a directory is HF, a GGUF file (by its magic) is GGUF, another
// file is llama2.c.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& path);

}  // namespace specula

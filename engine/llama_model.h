// The Llama-family forward pass (RMSNorm, RoPE, GQA attention over the paged KV cache, SwiGLU),
// written once against the Backend op interface.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/batch.h"
#include "engine/kv_cache.h"
#include "engine/weights.h"
#include "kernels/backend.h"

namespace specula {

enum class LogitsMode {
  kAll,              // one row per new token (prefill scoring, speculative verification)
  kLastPerSequence,  // one row per sequence (plain decoding), all rows for `all_logits` sequences
};

class LlamaModel {
 public:
  LlamaModel(std::unique_ptr<ModelWeights> weights, std::unique_ptr<Backend> backend);

  const ModelConfig& config() const { return weights_->config; }

  // Runs one step for a batch of sequences. Writes the new tokens' K/V into `kv` and returns logits
  // in `logits`: [num_tokens or num_seqs, vocab_size], in batch order. Bad input (token id out of
  // range, context overflow, short block table) is an InvalidArgument error and touches nothing.
  absl::Status Forward(const ForwardBatch& batch, KvCache& kv, LogitsMode mode,
                       std::vector<float>* logits);

 private:
  absl::Status Validate(const ForwardBatch& batch, const KvCache& kv) const;

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Backend> backend_;
  std::vector<float> cos_sin_;  // [max_seq_len, head_dim] RoPE cos | sin per position

  // Scratch, grown to the largest batch seen and reused across steps.
  std::vector<int32_t> token_ids_, positions_, slots_, query_start_, tables_, out_rows_;
  std::vector<float> x_;      // [T, dim] residual stream
  std::vector<float> xn_;     // [T, dim] normed
  std::vector<float> q_;      // [T, num_heads * head_dim]
  std::vector<float> k_;      // [T, num_kv_heads * head_dim]
  std::vector<float> v_;      // [T, num_kv_heads * head_dim]
  std::vector<float> attn_;   // [T, num_heads * head_dim]
  std::vector<float> proj_;   // [T, dim]
  std::vector<float> gate_;   // [T, hidden_dim]
  std::vector<float> up_;     // [T, hidden_dim]
  std::vector<float> final_;  // [rows, dim] rows whose logits are returned
};

}  // namespace specula

// Single-sequence generation on the paged engine: prefill, then decode one token per step.
// (The continuous-batching engine loop drives many sequences; this is the one-prompt path.)
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_model.h"
#include "model/sampler.h"

namespace specula {

struct GenerateOptions {
  int32_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<TokenId> stop_ids;  // generation ends after emitting one of these
  int32_t block_size = 16;
  int32_t prefill_chunk = 512;    // prompt tokens per forward call
};

struct GenerateResult {
  std::vector<TokenId> tokens;  // generated tokens, stop token included
  int32_t prompt_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;  // from the first to the last generated token
  bool stopped = false;         // a stop token ended generation
};

// Errors: an empty prompt, or a prompt that leaves no room in the model's context.
absl::StatusOr<GenerateResult> Generate(LlamaModel& model, absl::Span<const TokenId> prompt,
                                        const GenerateOptions& options,
                                        const std::function<void(TokenId)>& on_token = nullptr);

}  // namespace specula

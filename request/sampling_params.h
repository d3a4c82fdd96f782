// How a token is drawn from one row of logits: temperature, top-k, top-p, min-p, the penalties and
// logit biases, and the seed. Pure data and its validation; the sampler (model/sampler.h) applies it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/batch.h"

namespace specula {

struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy
  int32_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off; HF semantics (divide positive, multiply negative)
  // OpenAI's: logit[t] -= frequency_penalty * count(t) + presence_penalty * (count(t) > 0), count
  // over the generated tokens (the history from output_start on); in [-2, 2].
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<TokenId, float>> logit_bias;  // added to the logits, in [-100, 100]
  int32_t output_start = 0;  // where the history's generated tokens start (the engine sets it)
  // The seed the sampler draws from: a request's RequestSpec::seed once resolved (request/boundary.h).
  uint64_t seed = 0;

  // Whether anything changes the logits before temperature (penalties or biases).
  bool ProcessesLogits() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f || !logit_bias.empty();
  }
};

// Each field within its range. The message starts with the field's name (`temperature must be >= 0,
// got -1`, `logit_bias[7] must be in [-100, 100], got 101`), which is what HTTP's error names.
absl::Status ValidateSamplingParams(const SamplingParams& p);

}  // namespace specula

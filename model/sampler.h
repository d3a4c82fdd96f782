// Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p and a repetition
// penalty. A seed makes runs reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
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
  uint64_t seed = 0;

  // Whether anything changes the logits before temperature (penalties or biases).
  bool ProcessesLogits() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f || !logit_bias.empty();
  }
};

absl::Status ValidateSamplingParams(const SamplingParams& p);

// What changes the logits before temperature, in place: the repetition penalty, logit_bias, then the
// presence and frequency penalties. logits: [vocab].
void ProcessLogits(const SamplingParams& params, absl::Span<const TokenId> history, std::vector<float>* logits);

// The distribution a token is drawn from after all processing (ProcessLogits, temperature,
// top-k, top-p, min-p): probs[vocab], summing to 1; one-hot at the argmax when greedy. Needs no
// randomness, so proposers and the verifier call it directly.
void SamplingProbabilities(const SamplingParams& params, absl::Span<const float> logits,
                           absl::Span<const TokenId> history, std::vector<float>* probs);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  // logits: [vocab]. history: the tokens seen so far (for the repetition penalty).
  TokenId Sample(absl::Span<const float> logits, absl::Span<const TokenId> history);

  // The distribution Sample() draws from (SamplingProbabilities with this sampler's params).
  void Probabilities(absl::Span<const float> logits, absl::Span<const TokenId> history,
                     std::vector<float>* probs) const {
    SamplingProbabilities(params_, logits, history, probs);
  }
  // The uniform [0, 1) draw that Sample() would take next, for a sampler that runs elsewhere (a
  // backend's Sample kernel): the same seed gives the same stream of draws.
  double Draw() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  // Whether Backend::Sample computes this sampler's distribution (no penalty or bias, no min-p).
  static bool BackendCanSample(const SamplingParams& p) { return !p.ProcessesLogits() && p.min_p == 0.0f; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> probs_;  // [vocab]
};

}  // namespace specula

// Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p and a repetition
// penalty. A seed makes runs reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "core/batch.h"
#include "request/sampling_params.h"

namespace specula {

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

#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/categorical.h"

namespace specula {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0, got ", p.repetition_penalty));
  }
  return absl::OkStatus();
}

void SamplingProbabilities(const SamplingParams& params, absl::Span<const float> logits,
                           absl::Span<const TokenId> history, std::vector<float>* probs) {
  const int32_t n = static_cast<int32_t>(logits.size());
  std::vector<float>& p = *probs;
  p.assign(logits.begin(), logits.end());
  if (params.repetition_penalty != 1.0f) {
    std::vector<bool> seen(n, false);
    for (TokenId t : history) {
      if (t < 0 || t >= n || seen[t]) continue;
      seen[t] = true;
      p[t] = p[t] > 0 ? p[t] / params.repetition_penalty : p[t] * params.repetition_penalty;
    }
  }
  const int32_t argmax = Argmax(p);
  if (params.temperature == 0.0f) {
    std::fill(p.begin(), p.end(), 0.0f);
    p[argmax] = 1.0f;
    return;
  }
  // Softmax at temperature.
  const float max_logit = p[argmax];
  double sum = 0.0;
  for (float& v : p) {
    v = std::exp((v - max_logit) / params.temperature);
    sum += v;
  }
  for (float& v : p) v = static_cast<float>(v / sum);
  const bool use_top_k = params.top_k > 0 && params.top_k < n;
  if (use_top_k || params.top_p < 1.0f) {
    std::vector<int32_t> order(n);  // [vocab] token ids by descending probability
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    int32_t keep = use_top_k ? params.top_k : n;
    if (params.top_p < 1.0f) {
      double kept_mass = 0.0;
      double total = 0.0;
      for (int32_t i = 0; i < keep; ++i) total += p[order[i]];
      int32_t i = 0;
      // Smallest prefix whose (top-k renormalized) mass reaches top_p.
      while (i < keep) {
        kept_mass += p[order[i]];
        ++i;
        if (kept_mass >= params.top_p * total) break;
      }
      keep = i;
    }
    for (int32_t i = keep; i < n; ++i) p[order[i]] = 0.0f;
  }
  if (params.min_p > 0.0f) {
    const float threshold = params.min_p * *std::max_element(p.begin(), p.end());
    for (float& v : p) if (v < threshold) v = 0.0f;
  }
  sum = 0.0;
  for (float v : p) sum += v;
  for (float& v : p) v = static_cast<float>(v / sum);
}

TokenId Sampler::Sample(absl::Span<const float> logits, absl::Span<const TokenId> history) {
  // Greedy without a penalty is the argmax that the one-hot distribution below would give; it skips
  // two passes over the vocabulary and the draw (a greedy row never needs randomness).
  if (params_.temperature == 0.0f && params_.repetition_penalty == 1.0f) {
    return Argmax(logits);
  }
  Probabilities(logits, history, &probs_);
  return SampleCategorical(probs_, std::uniform_real_distribution<double>(0.0, 1.0)(rng_));
}

}  // namespace specula

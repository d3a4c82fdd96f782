// Sampling an index from a categorical distribution, and the greedy index, shared by the sampler,
// the proposers, the verifier and the CPU backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/types/span.h"
#include "core/batch.h"

namespace specula {

// Samples an index from non-negative `weights` (not necessarily normalized) with u in [0, 1).
// Zero-weight entries are never returned.
inline TokenId SampleCategorical(absl::Span<const float> weights, double u) {
  double total = 0.0;
  for (float w : weights) total += w;
  const double target = u * total;
  double cdf = 0.0;
  TokenId last = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0.0f) continue;
    cdf += weights[i];
    last = static_cast<TokenId>(i);
    if (target < cdf) return last;
  }
  return last;  // rounding: u landed past the accumulated mass
}

// The first index of the largest value, NaNs ignored (0 when there is none): the greedy token of
// the engine's sampler, its greedy distribution and the CPU backend's Sample op, so that they all
// agree. Two passes that vectorize: 16 running maxima, then a search for the first equal element
// (a compare-and-branch max_element took 12 us per 32000-token row).
inline TokenId Argmax(absl::Span<const float> logits) {
  const size_t n = logits.size();
  float lane[16];
  std::fill(std::begin(lane), std::end(lane), -INFINITY);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
  }
  float mx = -INFINITY;
  for (; i < n; ++i) mx = logits[i] > mx ? logits[i] : mx;
  for (float v : lane) mx = v > mx ? v : mx;
  const auto it = std::find(logits.begin(), logits.end(), mx);
  return it == logits.end() ? 0 : static_cast<TokenId>(it - logits.begin());
}

}  // namespace specula

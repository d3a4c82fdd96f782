// Sampling an index from a categorical distribution, shared by the sampler, the proposers and the
// verifier.
#pragma once

#include "absl/types/span.h"
#include "engine/core/batch.h"

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

}  // namespace specula

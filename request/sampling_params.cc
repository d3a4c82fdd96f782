#include "request/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

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
  for (auto [name, v] : {std::pair<const char*, float>{"presence_penalty", p.presence_penalty},
                         {"frequency_penalty", p.frequency_penalty}}) {
    if (!(v >= -2.0f && v <= 2.0f)) return absl::InvalidArgumentError(absl::StrCat(name, " must be in [-2, 2], got ", v));
  }
  for (auto [id, bias] : p.logit_bias) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias[", id, "] must be in [-100, 100], got ", bias));
    }
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("logit_bias: token id ", id, " is negative"));
  }
  return absl::OkStatus();
}

}  // namespace specula

// Log-probabilities as the OpenAI API returns them: the log-softmax of one row of the target's raw
// logits (before penalties, biases and temperature: vLLM's default), for the chosen token and the
// most likely ones.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "engine/request.h"

namespace specula {

// row: [vocab] logits. `top`: how many of the most likely tokens to list (ties by lower id).
TokenLogprobs ScoreToken(absl::Span<const float> row, TokenId token, int32_t top);

}  // namespace specula

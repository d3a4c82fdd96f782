// What an n-gram lookup would have drafted at each decode step of a finished request, and how many
// of those drafts its output then matched (sim/acceptance.h: DraftProfile). An n-gram point's trace
// records it so that the simulator replays the run's acceptance step by step, spans of copied text
// and all, whatever k it chooses.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "core/step.h"
#include "draft/ngram_proposer.h"
#include "sim/acceptance.h"

namespace specula::experiments {

// After g output tokens (g = 1 .. output.size() - 1) the engine's lookup sees the prompt and
// output[0, g); up to `max_k` drafts found, of which the first `matched` equal output[g, ...).
DraftProfile NgramDraftProfile(const NgramProposer& lookup, absl::Span<const TokenId> prompt,
                               absl::Span<const TokenId> output, int32_t max_k);

}  // namespace specula::experiments

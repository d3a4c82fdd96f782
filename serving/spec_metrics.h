// One request's speculative-decoding metrics in the shape of vLLM's per-request acceptance metrics
// (`--per-request-spec-decode-metrics`, its `metrics.speculative_decoding` object), with our
// acceptance per draft position beside them. One derivation for every surface: the OpenAI responses,
// gRPC's SpeculativeDecoding message and `specula generate --json`.
#pragma once

#include <cstdint>
#include <vector>

#include "nlohmann/json_fwd.hpp"
#include "verify/rejection_sampler.h"

namespace specula {

struct SpecDecodingMetrics {
  // Tokens per verification step, the bonus (or recovered) token included: 1 + accepted / steps;
  // 1.0 for a request that never verified drafts (each of its steps gave one token), as vLLM.
  double mean_acceptance_length = 1.0;
  double draft_acceptance_rate = 0.0;          // accepted / draft tokens; 0 without drafts
  std::vector<int64_t> acceptance_histogram;   // [num_spec_tokens + 1]: steps that accepted exactly j drafts
  int64_t num_spec_steps = 0;                  // verifications that carried drafts
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_draft_tokens = 0;       // the bonus tokens not counted
  int32_t num_spec_tokens = 0;                 // the configured k (the largest under auto)
  // [num_spec_tokens]: verifications that accepted draft i, and those that verified it with every
  // draft before it accepted; accepted / reached is draft i's conditional acceptance rate.
  std::vector<int64_t> accepted_per_position;
  std::vector<int64_t> reached_per_position;
};

// `s` padded to `num_spec_tokens` (a request that drafted less still has every bucket, as vLLM's
// dense histogram).
SpecDecodingMetrics SpecDecodingMetricsOf(const SpecStats& s, int32_t num_spec_tokens);

// The `speculative_decoding` object: vLLM's fields (mean_acceptance_length, draft_acceptance_rate,
// acceptance_histogram, num_spec_steps, num_accepted_draft_tokens, num_draft_tokens,
// num_spec_tokens), then accepted_per_position and reached_per_position.
nlohmann::json SpecDecodingJson(const SpecStats& s, int32_t num_spec_tokens);

}  // namespace specula

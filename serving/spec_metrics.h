// One request's speculative-decoding metrics in the shape of vLLM's per-request acceptance metrics
// (`--per-request-spec-decode-metrics`, its `metrics.speculative_decoding` object), with our
// acceptance per draft position and structured output's drafts beside them. One derivation for every
// surface: the OpenAI responses, gRPC's SpeculativeDecoding message and `specula generate --json`.
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
  // [num_spec_tokens + 1], or longer where a grammar forced more drafts in a step: steps that
  // accepted exactly j drafts.
  std::vector<int64_t> acceptance_histogram;
  int64_t num_spec_steps = 0;                  // verifications that carried drafts
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_draft_tokens = 0;       // the bonus tokens not counted
  int32_t num_spec_tokens = 0;                 // the configured k (the largest under auto; 0: no proposer)
  // [acceptance_histogram's size - 1]: verifications that accepted draft i, and those that verified
  // it with every draft before it accepted; accepted / reached is draft i's conditional acceptance rate.
  std::vector<int64_t> accepted_per_position;
  std::vector<int64_t> reached_per_position;
  // Structured output: drafts the grammar forced (counted in num_draft_tokens too), those accepted,
  // and the proposer's drafts cut where they left the grammar (never verified, so not counted there).
  int64_t num_forced_draft_tokens = 0;
  int64_t num_accepted_forced_tokens = 0;
  int64_t num_grammar_cut_tokens = 0;
};

// Whether a request's response carries its metrics. num_spec_tokens: the server's k, 0 without a
// proposer, -1 with the metrics turned off. With a proposer every request does (zeros for one that
// never drafted); without one only a request that had drafts (its grammar's forced ones).
bool ShowsSpecDecoding(const SpecStats& s, int32_t num_spec_tokens);

// `s` padded to `num_spec_tokens` (a request that drafted less still has every bucket, as vLLM's
// dense histogram).
SpecDecodingMetrics SpecDecodingMetricsOf(const SpecStats& s, int32_t num_spec_tokens);

// The `speculative_decoding` object: vLLM's fields (mean_acceptance_length, draft_acceptance_rate,
// acceptance_histogram, num_spec_steps, num_accepted_draft_tokens, num_draft_tokens,
// num_spec_tokens), then accepted_per_position, reached_per_position, num_forced_draft_tokens,
// num_accepted_forced_tokens and num_grammar_cut_tokens.
nlohmann::json SpecDecodingJson(const SpecStats& s, int32_t num_spec_tokens);

}  // namespace specula

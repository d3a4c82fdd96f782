// What a request asks for, whichever surface it came from (HTTP, gRPC, a prompts file, an experiment,
// the engine's own callers): sampling, stops, limits, logprobs, samples and seed. Neither the prompt
// nor an id: a surface gives its prompt to NormalizeRequest (request/boundary.h) beside the spec, and
// the engine's Request (engine/request.h) is a spec with its id and prompt token ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/batch.h"
#include "core/constraint_spec.h"
#include "request/sampling_params.h"

namespace specula {

struct RequestSpec {
  SamplingParams sampling;
  // Tokens to generate at most. 0: the surface's default (request/boundary.h's table).
  int32_t max_tokens = 0;
  std::vector<TokenId> stop_ids;          // in addition to the model's end tokens unless ignore_eos
  std::vector<std::string> stop_strings;  // needs a tokenizer
  bool ignore_eos = false;
  int32_t priority = 0;  // lower is served first
  // -1: none. N >= 0: each generated token's log-probability with the N most likely tokens'.
  int32_t logprobs = -1;
  // -1: none. N >= 0: the same for every prompt token after the first (the prompt then skips the
  // prefix cache: every position must be computed to be scored).
  int32_t prompt_logprobs = -1;
  int32_t n = 1;  // samples of the prompt; the serving core makes one engine request of each
  // The seed the request asked for. Unset: the surface's (the table's "seed" column). Resolving it
  // moves it into sampling.seed and leaves this unset, which is how the engine takes a request.
  std::optional<uint64_t> seed;
  // Structured output: a JSON schema, regex, choice, grammar or tool-call tag the tokens must follow
  // (constrain/ checks and compiles it).
  ConstraintSpec constraint;
  // vLLM's cache_salt: roots the request's prefix chain (core/block_hash.h), so that it shares cached
  // KV blocks, local or in a shared store, only with requests of the same salt. Empty: none.
  std::string cache_salt;
};

// The longest cache_salt accepted, in bytes.
inline constexpr size_t kMaxCacheSaltBytes = 1024;

}  // namespace specula

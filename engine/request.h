// A request as every surface gives it to the engine (CLI, batch, gRPC, HTTP, experiments), what it
// produced, and the deltas the engine's step returns for it. A request is a RequestSpec that
// NormalizeRequest (request/boundary.h) filled and checked, with its id and prompt token ids; the
// engine checks it again under the table's engine row (ValidateRequest), and it has one stop set
// (StopTokenIds), whichever surface it came from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "constrain/constraint.h"
#include "core/step.h"
#include "model/model_config.h"
#include "model/sampler.h"
#include "request/boundary.h"
#include "request/request_spec.h"
#include "tokenizer/tokenizer.h"
#include "verify/rejection_sampler.h"

namespace specula {

// One token's log-probabilities under the target's raw logits (the log-softmax before any sampling
// processing: vLLM's default logprobs mode): the token's own and the most likely tokens', best first.
struct TokenLogprobs {
  TokenId token = 0;
  float logprob = 0;
  std::vector<std::pair<TokenId, float>> top;  // [the request's logprobs count]
};

// The spec's fields keep their names here (r.max_tokens, r.sampling, ...): the engine reads them as
// its own. max_tokens has no default in the engine: the caller gives it, or NormalizeRequest does.
struct Request : RequestSpec {
  RequestId id = 0;
  std::vector<TokenId> prompt;
  // The constraint compiled (Engine::CompileConstraint, on the caller's thread, so that compiling
  // never holds up the engine's steps); null with a constraint: AddRequest compiles it.
  std::shared_ptr<const CompiledConstraint> compiled_constraint;
};

// A normalized spec and its prompt as the engine's request.
Request MakeRequest(RequestId id, std::vector<TokenId> prompt, RequestSpec spec);

// NormalizeRequest's context for a model: its vocabulary and context length, text encoded with
// `tokenizer` (null: token ids only, and no stop strings). The caller sets the configured
// default_max_tokens, add_bos and max_prompt_bytes where its surface has them.
RequestContext ModelRequestContext(const Tokenizer* tokenizer, int32_t vocab_size, int32_t max_model_len);

struct RequestOutput {
  RequestId id = 0;
  std::vector<TokenId> tokens;  // generated
  std::string text;             // generated text (stop string cut off; valid UTF-8), when a tokenizer is set
  FinishReason finish = FinishReason::kNone;
  std::string error;
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache, local or shared
  // Shared KV (--kv-store): prompt tokens whose blocks the store gave, and the milliseconds spent
  // fetching them (off the engine's thread) and installing them (on it) before it was scheduled.
  int32_t kv_store_tokens = 0;
  double kv_fetch_ms = 0, kv_install_ms = 0;
  int32_t num_preemptions = 0;
  // Milliseconds since the engine started. scheduled_ms: the step that first scheduled it (it left
  // the waiting queue; 0: never).
  double arrival_ms = 0, scheduled_ms = 0, first_token_ms = 0, finish_ms = 0;
  std::vector<double> token_ms;  // [tokens]
  std::vector<TokenLogprobs> logprobs;         // [tokens] when the request asked
  std::vector<TokenLogprobs> prompt_logprobs;  // [prompt_tokens - 1] when the request asked

  SpecStats spec;  // drafts, draft tokens, accepted tokens, accepted per position

  double ttft_ms() const { return first_token_ms - arrival_ms; }
  double tpot_ms() const {
    return tokens.size() > 1 ? (token_ms.back() - token_ms.front()) / (tokens.size() - 1) : 0.0;
  }
};

// What a request produced since its previous delta. The text lags the tokens by up to the longest
// stop string's length - 1 bytes until the last delta (vLLM's hold-back), and a UTF-8 character cut
// by a token boundary waits for the next; so the deltas' text adds up to the final text, is valid
// UTF-8 (invalid bytes become U+FFFD) and never holds a stop string. The last delta has `finished`
// set and carries the whole output in `final`, or the reason the request was refused in `error`.
struct RequestDelta {
  RequestId id = 0;
  std::vector<TokenId> tokens;
  std::vector<TokenLogprobs> logprobs;         // [tokens] when the request asked
  std::vector<TokenLogprobs> prompt_logprobs;  // the first delta's, when the request asked
  std::string text;
  bool finished = false;
  absl::Status error;  // not OK: the request was refused (bad input) and never ran
  RequestOutput final;
};

// The token ids that end a request: its own stop_ids and, unless ignore_eos, the model's end
// tokens: the tokenizer's EOS and every id the model's config lists (llama2.c models list BOS, which
// ends a story there). The one rule for every surface.
std::vector<TokenId> StopTokenIds(const Request& r, const ModelConfig& model, const Tokenizer* tokenizer);

// CheckRequest under the table's engine row; errors name the request, then the field. (The
// context's length and what depends on the KV pool the scheduler checks when it takes the request.)
absl::Status ValidateRequest(const Request& r, int32_t vocab_size, bool has_tokenizer);

}  // namespace specula

// The request boundary: every surface (HTTP completions and chat, gRPC, the serving core in
// process, a prompts file, one prompt, an experiment, the engine's own callers) turns what it
// parsed into a RequestSpec and a prompt, and NormalizeRequest fills the surface's defaults and
// checks every field against one table of defaults and bounds, with a row per surface where
// surfaces differ. Errors are INVALID_ARGUMENT and start with the field's name as the surface
// names it (`max_tokens: ...`, gRPC's `sampling.max_tokens: ...`), which HTTP's error JSON gives as
// its `param`. No wire format, tokenizer or model here: text is encoded through the context.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/batch.h"
#include "request/request_spec.h"

namespace specula {

enum class Surface {
  kCompletions,  // HTTP POST /v1/completions
  kChat,         // HTTP POST /v1/chat/completions
  kGrpc,         // specula.v1.Generation/Generate
  kInProcess,    // the serving core called in process (an ONLINE experiment's client, calibration)
  kPromptsFile,  // `specula generate --prompts-file`
  kOnePrompt,    // `specula generate --prompt` (--prompt-file, --messages)
  kExperiment,   // an OFFLINE experiment's workload
  kEngine,       // Engine::AddRequest's own callers (ValidateRequest)
};
inline constexpr int kNumSurfaces = 8;

// Where max_tokens comes from when a request gives none (0).
enum class LengthDefault {
  kFixed,       // the row's fixed_max_tokens (OpenAI's 16 for completions)
  kConfigured,  // the configuration's (RequestContext::default_max_tokens): --max-tokens, workload.max_tokens
  kNone,        // none: the caller gives it
};

// What a max_tokens gets that is more than the room the prompt leaves in the context.
enum class OverRoom {
  kRefused,        // an error naming max_tokens and the room (as vLLM's 400)
  kCapped,         // cut to the room
  kRunsToContext,  // kept: the request ends where the context does, with finish reason "length"
};

// Where the seed comes from when a request gives none.
enum class SeedDefault {
  kRequestId,   // the engine request's id (the serving core resolves it at admission: ResolveSeed)
  kConfigured,  // the starting spec's sampling.seed: --seed (SpecDefaults)
};

// A bound that is the model's vocabulary size.
inline constexpr int32_t kVocabularyBound = -1;
// --max-tokens when not given (generate and serve).
inline constexpr int32_t kMaxTokensFlagDefault = 256;
// An experiment's workload.max_tokens when the spec leaves it 0.
inline constexpr int32_t kWorkloadMaxTokensDefault = 128;

// One row of the table.
struct SurfaceRules {
  Surface surface;
  const char* name;          // as --help and docs/architecture.md name the row
  const char* field_prefix;  // before a field's name in errors: where the surface keeps it (gRPC's sub-message)
  LengthDefault length_default;
  int32_t fixed_max_tokens;    // kFixed's
  const char* configured_by;   // kConfigured's: what sets it, ...
  int32_t configured_default;  // ... and its value when nothing does
  OverRoom default_over_room;  // a default max_tokens past the room
  OverRoom given_over_room;    // a given max_tokens past the room
  int32_t max_max_tokens;      // a given max_tokens is in [1, this]
  int32_t max_logprobs;        // logprobs and prompt_logprobs in [0, this] or -1 (none); kVocabularyBound
  int32_t max_n;               // samples in [1, this]
  bool refuse_empty_stop;      // an empty stop string: refused, or ignored (it never matches)
  SeedDefault seed_default;
  const char* configured_seed;       // kConfigured's: what sets it
  std::optional<float> temperature;  // when absent; unset: the configuration's, ...
  const char* configured_sampling;   // ... which this names
};

// The table, one row per Surface in the enum's order.
const SurfaceRules& RulesOf(Surface surface);
absl::Span<const SurfaceRules> SurfaceTable();
// The table as markdown (columns: surface, fields in errors, max_tokens absent, max_tokens given,
// logprobs, n, empty stop, seed, temperature): `specula serve --help` and `generate --help` print
// it, and docs/architecture.md carries it (a test compares them).
std::string SurfaceTableMarkdown();

// What a request is checked against: the model, the configuration and the tokenizer.
struct RequestContext {
  int32_t vocab_size = 0;
  int32_t max_model_len = 0;  // 0: unknown here (the engine's own callers: the scheduler checks it)
  // Text to token ids (Tokenizer::Encode); null: text prompts are refused.
  std::function<std::vector<TokenId>(std::string_view text, bool add_bos)> encode;
  bool has_tokenizer = true;           // false: stop strings are refused (no text to match them in)
  bool add_bos = true;                 // BOS before a text prompt that is not a rendered template
  size_t max_prompt_bytes = SIZE_MAX;  // a longer text is refused before it is encoded
  int32_t default_max_tokens = 0;      // kConfigured rows' default; 0: the row's configured_default
};

// A request's prompt as its surface gave it: text, or token ids.
struct PromptInput {
  std::optional<std::string_view> text;  // encoded with RequestContext::encode
  bool templated = false;                // the text is a rendered chat template, which writes its own BOS
  absl::Span<const TokenId> ids;         // used as given
};

// The spec a surface starts from before the request's own fields: `configured` (the CLI's sampling
// flags and --seed) where the row's temperature is the configuration's, else SamplingParams' own
// with the row's temperature.
RequestSpec SpecDefaults(Surface surface, const SamplingParams& configured = {});

// Fills the row's defaults into `spec` (max_tokens, capped where the row says; the seed on
// kConfigured rows) and checks the prompt and every field. Returns the prompt's token ids.
absl::StatusOr<std::vector<TokenId>> NormalizeRequest(Surface surface, const RequestContext& context,
                                                      const PromptInput& prompt, RequestSpec* spec);

// The checks of NormalizeRequest on a request whose defaults are filled (the engine's own callers,
// ValidateRequest): prompt ids in the vocabulary, max_tokens, stops, logprobs, n, the seed resolved,
// no constraint, biases and sampling.
absl::Status CheckRequest(Surface surface, const RequestContext& context, absl::Span<const TokenId> prompt,
                          const RequestSpec& spec);

// A max_tokens a wire format gave explicitly, where 0 and less are not "absent" (HTTP's max_tokens,
// a prompts-file line's): in [1, the row's max_max_tokens], else the error naming it.
absl::Status CheckGivenMaxTokens(Surface surface, int64_t max_tokens);

// The seed into sampling.seed: the spec's own, else `fallback`; the spec's then unset.
void ResolveSeed(RequestSpec* spec, uint64_t fallback);

}  // namespace specula

#include "request/boundary.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace specula {
namespace {

constexpr int32_t kNoLimit = std::numeric_limits<int32_t>::max();

// The table. Serving's rows keep OpenAI's and vLLM's bounds (20 logprobs, 128 samples); the CLI's
// and the engine's requests reach the engine directly, which scores up to the whole vocabulary.
constexpr std::array<SurfaceRules, kNumSurfaces> kTable = {{
    {Surface::kCompletions, "completions", "", LengthDefault::kFixed, 16, "", 0, OverRoom::kRefused,
     OverRoom::kRefused, kNoLimit, 20, 128, true, SeedDefault::kRequestId, "", 1.0f, ""},
    {Surface::kChat, "chat", "", LengthDefault::kConfigured, 0, "--max-tokens", kMaxTokensFlagDefault,
     OverRoom::kCapped, OverRoom::kRefused, kNoLimit, 20, 128, true, SeedDefault::kRequestId, "", 1.0f, ""},
    {Surface::kGrpc, "grpc", "sampling.", LengthDefault::kConfigured, 0, "--max-tokens", kMaxTokensFlagDefault,
     OverRoom::kCapped, OverRoom::kRefused, kNoLimit, 20, 128, true, SeedDefault::kRequestId, "", 0.0f, ""},
    {Surface::kInProcess, "in-process", "", LengthDefault::kConfigured, 0, "the server's default",
     kMaxTokensFlagDefault, OverRoom::kCapped, OverRoom::kRefused, kNoLimit, 20, 128, true,
     SeedDefault::kRequestId, "", 0.0f, ""},
    {Surface::kPromptsFile, "prompts-file", "", LengthDefault::kConfigured, 0, "--max-tokens", kMaxTokensFlagDefault,
     OverRoom::kRunsToContext, OverRoom::kRunsToContext, 1 << 24, kVocabularyBound, 1, false,
     SeedDefault::kConfigured, "--seed", std::nullopt, "--temperature"},
    {Surface::kOnePrompt, "one-prompt", "", LengthDefault::kConfigured, 0, "--max-tokens", kMaxTokensFlagDefault,
     OverRoom::kCapped, OverRoom::kCapped, kNoLimit, kVocabularyBound, 1, false, SeedDefault::kConfigured, "--seed",
     std::nullopt, "--temperature"},
    {Surface::kExperiment, "experiment", "", LengthDefault::kConfigured, 0, "workload.max_tokens",
     kWorkloadMaxTokensDefault, OverRoom::kCapped, OverRoom::kCapped, kNoLimit, kVocabularyBound, 1, false,
     SeedDefault::kConfigured, "workload.seed + the request's index", std::nullopt, "the point's"},
    {Surface::kEngine, "engine", "", LengthDefault::kNone, 0, "", 0, OverRoom::kRunsToContext,
     OverRoom::kRunsToContext, kNoLimit, kVocabularyBound, 1, false, SeedDefault::kConfigured, "sampling.seed",
     0.0f, ""},
}};

constexpr bool InEnumOrder() {
  for (int i = 0; i < kNumSurfaces; ++i) {
    if (static_cast<int>(kTable[i].surface) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kTable has one row per Surface, in the enum's order");

absl::Status Bad(const SurfaceRules& rules, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(rules.field_prefix, field, ": ", what));
}

int32_t MaxLogprobs(const SurfaceRules& rules, const RequestContext& context) {
  return rules.max_logprobs == kVocabularyBound ? context.vocab_size : rules.max_logprobs;
}

// Named as the wire's prompt_token_ids, or as a normalized request's prompt of token ids.
absl::Status CheckPromptIds(absl::Span<const TokenId> ids, int32_t vocab, bool normalized) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(normalized ? "prompt[" : "prompt_token_ids[", i, "]: ",
                                                     normalized ? "token id " : "", ids[i],
                                                     " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// The prompt's token ids: exactly one of text and ids, the ids in the vocabulary, the text within
// the byte bound (before the work of encoding it) and encoding to some tokens, and room left in the
// context.
absl::StatusOr<std::vector<TokenId>> PromptIds(const RequestContext& c, const PromptInput& p) {
  if (p.text.has_value() == !p.ids.empty()) {
    return absl::InvalidArgumentError(p.text.has_value() ? "prompt and prompt_token_ids: give one, not both"
                                                         : "prompt: empty; give prompt or prompt_token_ids");
  }
  std::vector<TokenId> ids;
  if (!p.ids.empty()) {
    RETURN_IF_ERROR(CheckPromptIds(p.ids, c.vocab_size, /*normalized=*/false));
    ids.assign(p.ids.begin(), p.ids.end());
  } else {
    if (p.text->size() > c.max_prompt_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: ", p.text->size(), " bytes cannot fit the context of ",
                                                     c.max_model_len, " tokens (at most ", c.max_prompt_bytes,
                                                     " bytes)"));
    }
    if (!c.encode) return absl::InvalidArgumentError("prompt: a text prompt needs a tokenizer");
    ids = c.encode(*p.text, c.add_bos && !p.templated);
    if (ids.empty()) return absl::InvalidArgumentError("prompt: encodes to no tokens");
  }
  const int32_t len = static_cast<int32_t>(ids.size());
  if (c.max_model_len > 0 && len >= c.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        p.text.has_value() ? "prompt" : "prompt_token_ids", ": ", len, " tokens ",
        len > c.max_model_len ? "are longer than" : "fill", " the context of ", c.max_model_len,
        " tokens and leave no room to generate"));
  }
  return ids;
}

// max_tokens when the request gives none, and either cut to the room where the row says.
void ApplyLength(const SurfaceRules& rules, const RequestContext& c, int32_t prompt_tokens, RequestSpec* spec) {
  const bool given = spec->max_tokens != 0;
  if (!given) {
    if (rules.length_default == LengthDefault::kFixed) spec->max_tokens = rules.fixed_max_tokens;
    if (rules.length_default == LengthDefault::kConfigured) {
      spec->max_tokens = c.default_max_tokens > 0 ? c.default_max_tokens : rules.configured_default;
    }
  }
  if (c.max_model_len > 0 && (given ? rules.given_over_room : rules.default_over_room) == OverRoom::kCapped) {
    spec->max_tokens = std::min(spec->max_tokens, c.max_model_len - prompt_tokens);
  }
}

// `over`: the row's rule for a max_tokens past the room, the default's or the given one's.
absl::Status CheckLength(const SurfaceRules& rules, const RequestContext& c, int32_t prompt_tokens,
                         const RequestSpec& spec, OverRoom over) {
  if (spec.max_tokens < 1 || spec.max_tokens > rules.max_max_tokens) {
    const std::string range = rules.max_max_tokens == kNoLimit ? std::string(">= 1")
                                                                : absl::StrCat("in [1, ", rules.max_max_tokens, "]");
    const char* absent = rules.length_default == LengthDefault::kNone ? "" : " (or 0: the default)";
    return Bad(rules, "max_tokens", absl::StrCat("must be ", range, absent, ", got ", spec.max_tokens));
  }
  const int32_t room = c.max_model_len - prompt_tokens;
  if (c.max_model_len > 0 && over == OverRoom::kRefused && spec.max_tokens > room) {
    return Bad(rules, "max_tokens", absl::StrCat(spec.max_tokens, " and the prompt's ", prompt_tokens,
                                                 " tokens exceed the context of ", c.max_model_len,
                                                 " tokens; at most ", room, " here"));
  }
  return absl::OkStatus();
}

absl::Status CheckOutputs(const SurfaceRules& rules, const RequestContext& c, const RequestSpec& spec) {
  for (size_t i = 0; i < spec.stop_strings.size(); ++i) {
    if (rules.refuse_empty_stop && spec.stop_strings[i].empty()) {
      return Bad(rules, absl::StrCat("stop[", i, "]"), "empty string");
    }
  }
  if (!spec.stop_strings.empty() && !c.has_tokenizer) return Bad(rules, "stop", "stop strings need a tokenizer");
  const int32_t most = MaxLogprobs(rules, c);
  for (auto [name, n] : {std::pair<const char*, int32_t>{"logprobs", spec.logprobs},
                         {"prompt_logprobs", spec.prompt_logprobs}}) {
    if (n < -1 || n > most) return Bad(rules, name, absl::StrCat("must be in [0, ", most, "] (or unset), got ", n));
  }
  if (spec.n < 1 || spec.n > rules.max_n) {
    return Bad(rules, "n", rules.max_n == 1 ? absl::StrCat("must be 1 here (one sample per request), got ", spec.n)
                                            : absl::StrCat("must be in [1, ", rules.max_n, "], got ", spec.n));
  }
  return absl::OkStatus();
}

// What the boundary checks of a constraint: that it has what its kind needs, and no flag that defeats
// it. Its keywords and bounds are constrain/'s (checked where it compiles).
absl::Status CheckConstraintFields(const SurfaceRules& rules, const RequestSpec& spec) {
  const ConstraintSpec& c = spec.constraint;
  if (!c.active()) return absl::OkStatus();
  const std::string field = c.field.empty() ? "constraint" : c.field;
  const bool needs_text = c.kind != ConstraintSpec::Kind::kJsonObject && c.kind != ConstraintSpec::Kind::kChoice;
  if (needs_text && c.text.empty()) return Bad(rules, field, absl::StrCat("an empty ", ConstraintKindName(c.kind)));
  if (c.kind == ConstraintSpec::Kind::kChoice && c.choices.empty()) return Bad(rules, field, "no choices");
  if (spec.ignore_eos) {
    return Bad(rules, "ignore_eos", absl::StrCat("cannot be set with structured output (", field,
                                                 "): the output ends when its grammar does"));
  }
  return absl::OkStatus();
}

absl::Status CheckSampling(const SurfaceRules& rules, const RequestContext& c, const RequestSpec& spec) {
  if (spec.seed.has_value() && rules.seed_default == SeedDefault::kConfigured) {
    return Bad(rules, "seed", "not resolved into sampling.seed (NormalizeRequest resolves it)");
  }
  if (absl::Status st = CheckConstraintFields(rules, spec); !st.ok()) return st;
  if (spec.cache_salt.size() > kMaxCacheSaltBytes) {
    // A request's own field on every surface (gRPC's too, beside its sampling message): no prefix.
    return absl::InvalidArgumentError(
        absl::StrCat("cache_salt: ", spec.cache_salt.size(), " bytes; at most ", kMaxCacheSaltBytes));
  }
  for (auto [id, bias] : spec.sampling.logit_bias) {
    if (id < 0 || id >= c.vocab_size) {
      return Bad(rules, "logit_bias",
                 absl::StrCat("token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  if (absl::Status st = ValidateSamplingParams(spec.sampling); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(rules.field_prefix, st.message()));  // it starts with the field
  }
  return absl::OkStatus();
}

// Every field of a spec whose defaults are filled, in the order serving has always checked them.
absl::Status CheckFields(const SurfaceRules& rules, const RequestContext& c, int32_t prompt_tokens,
                         const RequestSpec& spec, OverRoom over) {
  RETURN_IF_ERROR(CheckLength(rules, c, prompt_tokens, spec, over));
  RETURN_IF_ERROR(CheckOutputs(rules, c, spec));
  return CheckSampling(rules, c, spec);
}

}  // namespace

const SurfaceRules& RulesOf(Surface surface) { return kTable[static_cast<int>(surface)]; }

absl::Span<const SurfaceRules> SurfaceTable() { return kTable; }

RequestSpec SpecDefaults(Surface surface, const SamplingParams& configured) {
  const SurfaceRules& rules = RulesOf(surface);
  RequestSpec spec;
  if (rules.temperature.has_value()) {
    spec.sampling.temperature = *rules.temperature;
  } else {
    spec.sampling = configured;
  }
  return spec;
}

absl::StatusOr<std::vector<TokenId>> NormalizeRequest(Surface surface, const RequestContext& context,
                                                      const PromptInput& prompt, RequestSpec* spec) {
  const SurfaceRules& rules = RulesOf(surface);
  ASSIGN_OR_RETURN(std::vector<TokenId> ids, PromptIds(context, prompt));
  const OverRoom over = spec->max_tokens != 0 ? rules.given_over_room : rules.default_over_room;
  ApplyLength(rules, context, static_cast<int32_t>(ids.size()), spec);
  if (rules.seed_default == SeedDefault::kConfigured) ResolveSeed(spec, spec->sampling.seed);
  RETURN_IF_ERROR(CheckFields(rules, context, static_cast<int32_t>(ids.size()), *spec, over));
  return ids;
}

absl::Status CheckRequest(Surface surface, const RequestContext& context, absl::Span<const TokenId> prompt,
                          const RequestSpec& spec) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: empty");
  RETURN_IF_ERROR(CheckPromptIds(prompt, context.vocab_size, /*normalized=*/true));
  const SurfaceRules& rules = RulesOf(surface);
  return CheckFields(rules, context, static_cast<int32_t>(prompt.size()), spec, rules.given_over_room);
}

absl::Status CheckGivenMaxTokens(Surface surface, int64_t max_tokens) {
  const SurfaceRules& rules = RulesOf(surface);
  if (max_tokens >= 1 && max_tokens <= rules.max_max_tokens) return absl::OkStatus();
  return Bad(rules, "max_tokens",
             rules.max_max_tokens == kNoLimit
                 ? absl::StrCat("must be >= 1, got ", max_tokens)
                 : absl::StrCat("must be in [1, ", rules.max_max_tokens, "], got ", max_tokens));
}

namespace {

std::string LengthCell(const SurfaceRules& r, OverRoom over, bool given) {
  std::string from;
  if (given) {
    from = r.max_max_tokens == kNoLimit ? "1 or more" : absl::StrCat("1 to ", r.max_max_tokens);
  } else if (r.length_default == LengthDefault::kFixed) {
    from = absl::StrCat(r.fixed_max_tokens);
  } else if (r.length_default == LengthDefault::kConfigured) {
    from = absl::StrCat(r.configured_by, " (", r.configured_default, ")");
  } else {
    return "none: required";
  }
  const char* past = over == OverRoom::kRefused  ? "refused"
                     : over == OverRoom::kCapped ? "capped"
                                                 : "runs to the context's end";
  return absl::StrCat(from, "; past the room: ", past);
}

}  // namespace

std::string SurfaceTableMarkdown() {
  std::string out =
      "| surface | fields in errors | max_tokens absent | max_tokens given | logprobs | n | empty stop string | "
      "seed absent | temperature absent |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const SurfaceRules& r : kTable) {
    const std::string logprobs = r.max_logprobs == kVocabularyBound ? "0 to the vocabulary"
                                                                    : absl::StrCat("0 to ", r.max_logprobs);
    const std::string temperature = r.temperature.has_value() ? absl::StrCat(*r.temperature) : r.configured_sampling;
    absl::StrAppend(&out, "| `", r.name, "` | `", r.field_prefix, "max_tokens` | ",
                    LengthCell(r, r.default_over_room, false), " | ", LengthCell(r, r.given_over_room, true), " | ",
                    logprobs, " | ", r.max_n == 1 ? std::string("1") : absl::StrCat("1 to ", r.max_n), " | ",
                    r.refuse_empty_stop ? "refused" : "ignored", " | ",
                    r.seed_default == SeedDefault::kRequestId ? "the request id" : r.configured_seed, " | ", temperature,
                    " |\n");
  }
  return out;
}

void ResolveSeed(RequestSpec* spec, uint64_t fallback) {
  spec->sampling.seed = spec->seed.value_or(fallback);
  spec->seed.reset();
}

}  // namespace specula

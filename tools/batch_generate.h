// `specula generate --prompts-file prompts.jsonl`: runs every prompt through the continuous-
// batching engine and writes one JSON line per request.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/engine_setup.h"
#include "nlohmann/json.hpp"
#include "request/boundary.h"

namespace specula {

// --chat: a line's prompt as a user message, to the text the chat template makes of it (which
// writes BOS where the model wants it). Unset: the prompt as it is.
using ChatRenderer = std::function<absl::StatusOr<std::string>(const std::string& prompt)>;

struct BatchOptions {
  std::string prompts_file;
  bool progress = true;
  ChatRenderer chat;
};

// What a --prompts-file line's request is built against: NormalizeRequest's context (the model's
// vocabulary and context, the tokenizer, BOS, --max-tokens), the sampling flags and --seed, and
// --ignore-eos, for the fields a line does not set; and --chat.
struct PromptLineContext {
  RequestContext request;
  SamplingParams sampling;
  bool ignore_eos = false;
  ChatRenderer chat;
};
PromptLineContext PromptLineContextOf(const LoadedEngine& e, ChatRenderer chat);

// Acceptance statistics as JSON (per request or in total).
nlohmann::json SpecStatsJson(const SpecStats& s);
// A finished request as one output line: id, text, token_ids, finish_reason, token counts,
// timings, preemptions; with speculation (`num_spec_tokens`, the engine's k, > 0) its acceptance
// statistics as "spec" and as "metrics": {"speculative_decoding": ...}, the object of the OpenAI
// responses (serving/spec_metrics.h).
nlohmann::json OutputJson(const nlohmann::json& id, const RequestOutput& o, int32_t num_spec_tokens);
// `j` and a newline, flushed (invalid UTF-8 replaced).
void WriteJsonLine(std::FILE* out, const nlohmann::json& j);
// One line for stderr.
std::string SpecStatsLine(const SpecStats& s);
// The speculation lengths chosen (a histogram over decoding sequence-steps) and the share of steps
// that speculated on no sequence, for stderr.
std::string SpecLengthLine(const EngineStats& s);

// One --prompts-file line (`line_number` counts from 1, and is the request's id) as a request,
// normalized under the table's prompts-file row: the fields it does not set come from `context`,
// and `id` is its "id" (the line number when absent). Returns "" or the error, which names the field.
std::string ParsePromptLine(const std::string& text, int32_t line_number, const PromptLineContext& context,
                            nlohmann::json* id, Request* request);

// Every line through the continuous-batching engine of `e`'s options. Malformed lines get an error
// naming the line and field (on stderr and as their JSON line); the other lines still run. Fails
// only when the file cannot be read.
absl::Status RunBatchGenerate(LoadedEngine& e, const BatchOptions& opt, std::FILE* out);

}  // namespace specula

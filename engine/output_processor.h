// The engine's one output path (vLLM v1's OutputProcessor): each request's generated tokens, their
// incremental detokenization, stop strings, the streaming hold-back, UTF-8 boundaries, timings and
// finish reasons, turned into the per-request deltas that Engine::Step returns. Stop tokens and the
// length limit end a request in the scheduler (it frees the KV and drops tokens past them); the
// engine then passes on only the tokens the scheduler kept.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"
#include "engine/request.h"
#include "tokenizer/tokenizer.h"

namespace specula {

class OutputProcessor {
 public:
  // `tokenizer` may be null: no text and no stop strings.
  explicit OutputProcessor(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}

  // A request the engine took (its last prompt token starts the detokenization).
  void Add(const Request& r, double now_ms);
  size_t num_tokens(RequestId id) const { return outputs_.at(id).out.tokens.size(); }
  // The step that first schedules a request.
  void Scheduled(RequestId id, double now_ms);
  // A verification of `drafts` drafts that accepted `accepted`.
  void RecordSpec(RequestId id, int32_t drafts, int32_t accepted) { outputs_.at(id).out.spec.Record(drafts, accepted); }
  // The step's new tokens of a request, at `now_ms`, with their logprobs ([tokens] or empty when
  // the request asked none); `cached_prompt_tokens` is recorded with the first. Returns true when a
  // stop string now appears in the text (it is cut there; the caller ends the request with
  // FinishReason::kStopString).
  bool Append(RequestId id, absl::Span<const TokenId> tokens, double now_ms, int32_t cached_prompt_tokens,
              absl::Span<const TokenLogprobs> logprobs = {});
  // Prompt logprobs in order (positions 1, 2, ... of the prompt); the first delta with tokens
  // carries them all.
  void AddPromptLogprobs(RequestId id, TokenLogprobs lp) { outputs_.at(id).out.prompt_logprobs.push_back(std::move(lp)); }
  size_t num_prompt_logprobs(RequestId id) const { return outputs_.at(id).out.prompt_logprobs.size(); }
  // Ends a request; its last delta carries the whole output.
  void Finish(RequestId id, FinishReason reason, double now_ms, int32_t num_preemptions, std::string error = "");
  // A delta for every request with new tokens or a finish since the last call; finished requests
  // are forgotten.
  std::vector<RequestDelta> TakeDeltas();

 private:
  struct State {
    RequestOutput out;
    std::vector<std::string> stop_strings;
    TokenId last = -1;       // the last token detokenized (the prompt's at first)
    size_t hold_back = 0;    // the longest stop string's length - 1
    size_t tokens_sent = 0;  // what the deltas so far carried (tokens, and their logprobs)
    bool prompt_logprobs_sent = false;
    size_t text_sent = 0;
    bool finished = false;
    bool changed = false;    // listed in changed_
  };
  void MarkChanged(RequestId id, State& s);
  RequestDelta DeltaOf(State& s);

  const Tokenizer* tokenizer_;
  std::unordered_map<RequestId, State> outputs_;
  std::vector<RequestId> changed_;  // requests with something for the next TakeDeltas, in order
};

}  // namespace specula

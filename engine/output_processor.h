// The engine's one output path (vLLM v1's OutputProcessor): each request's generated tokens, their
// incremental detokenization, stop strings, the streaming hold-back, UTF-8 boundaries, timings and
// finish reasons, turned into the per-request deltas that Engine::Step returns. Stop tokens and the
// length limit end a request in the scheduler (it frees the KV and drops tokens past them); the
// engine then passes on only the tokens the scheduler kept. A request's output state lives in its
// record (engine/request_record.h); the processor keeps none and is called once per step.
#pragma once

#include <string>
#include <vector>

#include "absl/types/span.h"
#include "engine/request.h"
#include "tokenizer/tokenizer.h"

namespace specula {

// A request's output so far, and what its deltas have carried of it.
struct OutputState {
  RequestOutput out;
  std::vector<std::string> stop_strings;
  TokenId last = -1;       // the last token detokenized (the prompt's at first)
  size_t hold_back = 0;    // the longest stop string's length - 1
  size_t tokens_sent = 0;  // what the deltas so far carried (tokens, and their logprobs)
  bool prompt_logprobs_sent = false;
  size_t text_sent = 0;
  bool finished = false;
};

// A request the engine took at `now_ms` (its last prompt token starts the detokenization).
OutputState StartOutput(const Request& r, double now_ms);

// What one step (or an abort between steps) brought one request.
struct OutputUpdate {
  OutputState* state = nullptr;
  absl::Span<const TokenId> tokens;            // the step's tokens the scheduler kept
  std::vector<TokenLogprobs> logprobs;         // [tokens], or empty when the request asked none
  std::vector<TokenLogprobs> prompt_logprobs;  // prompt positions the step's chunk scored, in order
  int32_t cached_prompt_tokens = 0;            // recorded with the first token
  // In: the scheduler's reason when the request ended (kNone: it runs on). Out: kStopString when
  // the text now holds a stop string (cut there): the caller ends the request in the scheduler.
  FinishReason finish = FinishReason::kNone;
  int32_t num_preemptions = 0;
  std::string error;
};

class OutputProcessor {
 public:
  // `tokenizer` may be null: no text and no stop strings.
  explicit OutputProcessor(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}

  // The step's one call: each update's tokens appended at `now_ms` and detokenized, stop strings
  // found, finished requests ended. Returns a delta, in order, for every update with new tokens or
  // a finish; a finished request's carries its whole output in `final`.
  std::vector<RequestDelta> Process(absl::Span<OutputUpdate> updates, double now_ms) const;

 private:
  // Returns true when a stop string now appears in the text.
  bool Append(OutputState& s, absl::Span<const TokenId> tokens, double now_ms, int32_t cached_prompt_tokens,
              absl::Span<const TokenLogprobs> logprobs) const;
  static RequestDelta DeltaOf(OutputState& s);

  const Tokenizer* tokenizer_;
};

}  // namespace specula

// The OpenAI JSON of `specula serve`'s HTTP API, apart from the transport: request bodies of
// /v1/completions and /v1/chat/completions parsed into a ServeRequest (errors name the field), and
// one call's deltas turned into responses (a JSON body, or server-sent events ending in
// `data: [DONE]`). No HTTP types here; nlohmann/json stays in openai_api.cc.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chat/chat.h"
#include "serving/server.h"
#include "serving/tool_calls.h"

namespace specula {

// A POST body of /v1/completions (`chat` false) or /v1/chat/completions (`chat` true), as the
// handler reads it before Server::Generate validates the request: the error is the one the client
// gets (INVALID_ARGUMENT naming the field: 400; NOT_FOUND for another `model`: 404). Chat
// messages are rendered with `chat_template` (null: chat is off, and `chat_source` says why).
struct HttpRequestBody {
  ServeRequest request;
  bool chat = false;
  bool stream = false;           // "stream": true
  bool usage_in_stream = false;  // "stream_options": {"include_usage": true}
  bool echo = false;             // completions: the prompt comes back before the completion
  // Completions' `logprobs: N`, or chat's `logprobs: true` with `top_logprobs: N`: -1 none.
  int32_t logprobs = -1;
  // vLLM's extensions: `return_token_ids` (the prompt's and each choice's token ids in the
  // response) and `return_tokens_as_token_ids` (logprobs name tokens "token_id:ID", not their text).
  bool return_token_ids = false;
  bool tokens_as_ids = false;
  // Choices returned. request.n samples are drawn (completions' best_of); when more, the n with the
  // highest total logprob are returned.
  int32_t n = 1;
  // Chat's tools, tool_choice and parallel_tool_calls (or the older functions and function_call):
  // what the template lists, and whether the output is read back for calls.
  ToolRequest tools;
};
absl::StatusOr<HttpRequestBody> ParseHttpRequestBody(const std::string& body, bool chat, const std::string& model,
                                                     const ChatTemplate* chat_template,
                                                     const absl::StatusOr<ChatSource>& chat_source);

// OpenAI's error JSON ({"error": {"message", "type", "param", "code"}}) and its HTTP status: 400
// bad input (param: the field the message starts with), 401, 403, 404, 409 (a reload the server's state
// refuses), 413, 429 overload, 503 draining.
int HttpStatusOf(const absl::Status& status);
std::string ErrorJson(const absl::Status& status, int http_status);

// One call's responses, built from its samples' deltas in the order they come.
class OpenAiResponder {
 public:
  struct Sample {
    std::string text;
    std::vector<TokenId> tokens;
    std::vector<TokenLogprobs> logprobs;         // [tokens] when asked
    std::vector<TokenLogprobs> prompt_logprobs;  // [prompt - 1] with echo and logprobs
    RequestOutput final;
    bool finished = false;
    bool first_sent = false;  // streamed: the role (chat) or the echoed prompt goes with the first chunk
    size_t offset = 0;        // completions' text_offset of the next token
    std::optional<ToolCallStream> tool_calls;  // streamed chat with tools: the calls read from the deltas
  };

  OpenAiResponder(const HttpRequestBody& call, std::string model, std::string id, const Generation& generation,
                  const Tokenizer* tokenizer, std::time_t created = std::time(nullptr));
  // What to send after one delta of sample `index`: when streaming, its SSE events (after the last
  // sample's last delta, the usage chunk if asked and `data: [DONE]`); otherwise "" until every
  // sample finished, then the whole JSON body. A sample the engine refused: its error, for the
  // transport to answer with (streaming: an SSE error event, returned as text).
  absl::StatusOr<std::string> Add(int32_t index, const RequestDelta& delta);
  bool done() const { return finished_ == static_cast<int32_t>(samples_.size()); }

 private:
  std::string StreamEvents(int32_t index, const RequestDelta& delta, bool refused);
  std::string Body() const;
  std::string EchoText() const;

  HttpRequestBody call_;
  std::string model_, id_;
  std::time_t created_;
  const Tokenizer* tokenizer_;
  std::vector<TokenId> prompt_;
  std::vector<Sample> samples_;  // [best_of]
  int32_t finished_ = 0;
  int32_t prompt_tokens_ = 0;
  // num_spec_tokens of the speculative-decoding metrics (Generation::spec_metrics_tokens); -1: none.
  // They go where vLLM puts them: `metrics.speculative_decoding` at the root (the body, or the
  // stream's usage chunk) for one choice; with n > 1 null there and one per choice (streamed: on
  // the choice's last chunk). Without a proposer only choices that had drafts carry them.
  int32_t spec_tokens_ = -1;
  // A server with a shared KV store: `metrics.kv_store` at the root ({fetched_tokens, fetch_ms,
  // install_ms}) beside speculative decoding's, in the body or the stream's usage chunk.
  bool kv_store_ = false;
  bool first_event_sent_ = false;
  std::string answered_by_;  // Generation::answered_by: "model", or "faq" (then in every body and chunk)
  std::string version_;      // Generation::model_version: every body's and chunk's system_fingerprint
};

}  // namespace specula

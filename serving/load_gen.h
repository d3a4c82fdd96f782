// The load generator behind `specula bench-serve`, in the manner of `vllm bench serve`, and reused
// by the experiment harness: an arrival schedule, a dataset of requests, a client per protocol, the
// run loop and the summary statistics (multi-turn conversations: serving/conversation.h). gRPC and
// HTTP types stay in load_gen.cc: a client is only the LoadClient interface here.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/arrivals.h"
#include "core/constraint_spec.h"
#include "core/stats.h"

namespace specula {

// ---- When each request is sent: ArrivalTimes (core/arrivals.h).

// ---- What is sent.

// One message of a conversation's history, with OpenAI's chat roles ("system", "user", "assistant").
struct LoadMessage {
  std::string role, content;
};

// Which conversation a request belongs to (serving/conversation.h); index -1: none.
struct SessionTurn {
  std::string id;      // sent as the X-Session-Id header (HTTP) and x-session-id metadata (gRPC)
  int32_t index = -1;  // the session's number in its run (a trace's "session")
  int32_t turn = 0;    // 0 for the session's first request
};

struct LoadRequest {
  std::string prompt;                     // text, tokenized by the server; or
  std::vector<int32_t> prompt_token_ids;  // token ids, used as given (synthetic prompts)
  int32_t max_tokens = 0;                 // 0: the server's default
  bool ignore_eos = false;
  int32_t priority = 0;                   // sent as the request's priority (lower is more urgent)
  ConstraintSpec constraint;              // structured output, sent as vLLM's structured_outputs
  // A conversation's turn, instead of a prompt: its history (HTTP /v1/chat/completions; gRPC and
  // in process: ConversationPrompt) and its session.
  std::vector<LoadMessage> messages = {};
  SessionTurn session = {};
};

// A conversation as one prompt, for surfaces that take a prompt (gRPC, in process): the messages'
// contents, each on its own line.
std::string ConversationPrompt(const std::vector<LoadMessage>& messages);

// JSON lines {"prompt": "...", "max_tokens": N, "ignore_eos": B, "priority": P} (all but the prompt
// optional), with the
// structured-output fields of the OpenAI surface (serving/openai_constraints.h: response_format,
// structured_outputs, guided_*, json_schema, grammar); tools are refused by name (chat only). The rest
// of a `specula generate --prompts-file` line is ignored. A malformed line fails the whole load, with
// an error naming its file, line and field: a benchmark on half a dataset would mislead.
absl::StatusOr<std::vector<LoadRequest>> LoadJsonlDataset(const std::string& path, int32_t default_max_tokens);

// n prompts of input_len token ids uniform in [0, vocab_size), each asking for exactly output_len
// tokens (ignore_eos), as vLLM's random dataset.
std::vector<LoadRequest> SyntheticDataset(int32_t n, int32_t input_len, int32_t output_len, int32_t vocab_size,
                                          uint64_t seed);

// ---- How one request went.

enum class Outcome { kOk, kRejected, kFailed };  // kRejected: gRPC RESOURCE_EXHAUSTED or HTTP 429

struct RequestResult {
  Outcome outcome = Outcome::kFailed;
  std::string error;          // empty when kOk
  double send_s = 0;          // when it was sent, from the benchmark start
  double ttft_s = 0;          // first message with tokens, from the send
  double e2e_s = 0;           // end of the stream (or the error), from the send
  std::vector<double> itl_s;  // the gap before each later message with tokens. With speculation one
                              // message may carry several tokens: this is a gap per message.
  int32_t prompt_tokens = 0;  // as the server counted them (usage), else the ids sent
  int32_t cached_tokens = 0;  // prompt tokens the server's prefix cache served (usage); 0 where it does not say
  int32_t output_tokens = 0;
  std::string text;           // the answer, kept for requests with messages (a conversation's next turn sends it)
  std::string replica;        // the replica that answered (serving/replica.h: its header or metadata); empty: none said
  std::string answered_by;    // the path that answered (model, faq: serving/replica.h); empty: none said
  std::string model_version;  // the version of the model that answered (serving/replica.h); empty: none said
};

struct ServerInfo {
  std::string model;       // the served model name
  int32_t vocab_size = 0;  // 0 when the endpoint does not say (HTTP)
};

struct ClientOptions {
  std::string model;  // HTTP "model"; empty: the first of GET /v1/models
  double temperature = 0.0;
  double request_timeout_s = 600.0;  // the gRPC deadline; the HTTP read timeout
  std::string api_key;  // non-empty: `Authorization: Bearer KEY` on every request (gRPC: metadata)
};

// Sends requests and times their streams. Send is called from many threads at once.
class LoadClient {
 public:
  virtual ~LoadClient() = default;
  virtual const ServerInfo& info() const = 0;
  virtual RequestResult Send(const LoadRequest& request) = 0;
};

// `grpc://HOST:PORT` (specula.v1.Generation/Generate, server streaming) or `http://HOST:PORT`
// (OpenAI POST /v1/completions with "stream": true; a request with messages: /v1/chat/completions).
// Asks the server for its model first (ModelInfo or GET /v1/models): an unreachable endpoint is an
// UnavailableError naming it.
absl::StatusOr<std::unique_ptr<LoadClient>> ConnectLoadClient(const std::string& endpoint, const ClientOptions& opt);

// ---- The run.

// With no --max-concurrency this many requests at most are in flight; later arrivals wait on the
// client, which RunResult::max_send_lag_s shows. One thread per slot (sync gRPC and httplib block).
constexpr int32_t kMaxInFlightDefault = 512;

struct RunOptions {
  int32_t max_concurrency = 0;  // 0: kMaxInFlightDefault
  // Called after each request ends, serialized, with the number ended so far.
  std::function<void(int32_t done, int32_t total)> on_progress;
};

struct RunResult {
  std::vector<RequestResult> requests;  // in dataset order
  double duration_s = 0;                // from the start to the end of the last request
  double max_send_lag_s = 0;            // the latest a request was sent after its arrival time
  double start_s = 0;  // the start, on the steady clock (seconds since its epoch): sent and end times count from it
};

// Sends requests[i] at arrivals[i] (same sizes) and waits for all of them.
RunResult RunLoad(LoadClient& client, const std::vector<LoadRequest>& requests, const std::vector<double>& arrivals,
                  const RunOptions& opt);

// ---- The summary, as vllm bench serve's.

// GoodputSlo, ParseGoodput, Stats, Percentile and Summarize(values): core/stats.h.

struct BenchSummary {
  int32_t completed = 0, rejected = 0, failed = 0, good = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0, request_goodput = 0;
  Stats ttft_ms, tpot_ms, itl_ms, e2el_ms;  // over completed requests (TPOT: those with > 1 token)
  Stats rejection_ms;                       // how fast refusals came back
  double tokens_per_message = 0;            // > 1 when speculation sends several tokens a message
  std::vector<std::string> first_errors;    // up to 5 distinct failure messages
  // By the replica each request named (RequestResult::replica); requests that named none (no answer,
  // another server, a proxy's own error) are counted in without_replica alone.
  struct ReplicaCounts {
    int32_t requests = 0, ok = 0, rejected = 0, failed = 0;
  };
  std::map<std::string, ReplicaCounts> replicas;
  int32_t without_replica = 0;
  // Every failed request (not the rejected ones) by its error's first kErrorKeyBytes bytes (cut at a
  // UTF-8 character's start), so that a run can say what failed and why.
  static constexpr size_t kErrorKeyBytes = 120;
  std::map<std::string, int32_t> failed_by_error;
};
BenchSummary Summarize(const RunResult& run, const GoodputSlo& slo);

// ---- Server-sent events.

// Splits an event stream into its `data:` payloads as chunks arrive, in any split. Other fields
// (event:, id:, comments) and blank lines are skipped.
class SseParser {
 public:
  void Feed(std::string_view chunk, const std::function<void(std::string_view data)>& on_data);

 private:
  std::string pending_;  // an incomplete last line
};

}  // namespace specula

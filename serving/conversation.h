// Multi-turn conversations for the load generator (`specula bench-serve --multi-turn`, an
// experiment's conversation workload), in the manner of vLLM's multi-turn benchmark: closed-loop
// sessions, each turn sending the history so far, the answer received and a new user message, to
// one of several endpoints. No wire types here: each turn goes through a LoadClient.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/stats.h"
#include "nlohmann/json_fwd.hpp"
#include "serving/load_gen.h"

namespace specula {

// Where each turn goes among n endpoints.
enum class TurnRouting {
  kSession,  // a session sticks to endpoint hash(session id) mod n (FNV-1a, MurmurHash3's finalizer)
  kRotate,   // turn t of session s goes to endpoint (s + t) mod n: each turn to another replica
};
absl::StatusOr<TurnRouting> ParseTurnRouting(const std::string& name);  // "session", "rotate"
const char* TurnRoutingName(TurnRouting r);
// The endpoint of turn `turn` of session `index` (id `id`) among `n`.
int32_t RouteTurn(TurnRouting routing, const std::string& id, int32_t index, int32_t turn, int32_t n);

struct ConversationOptions {
  int32_t num_sessions = 8;
  int32_t turns = 4;                // requests per session, each after the previous answer
  int32_t session_concurrency = 0;  // sessions in flight at once; 0: all (at most kMaxInFlightDefault)
  double think_time_s = 0;          // the pause between an answer and the session's next turn
  std::string system_prompt;        // empty: no system message
  // The text of each new user turn: user_messages[(s * turns + t) % size] for turn t of session s,
  // or, where there are none, user_words words drawn from a fixed list (seeded by seed, s and t).
  std::vector<std::string> user_messages;
  int32_t user_words = 16;
  int32_t max_tokens = 128;  // per answer; 0: the server's default
  bool ignore_eos = false;
  uint64_t seed = 0;         // session i is "s<seed>-<i>"
  TurnRouting routing = TurnRouting::kSession;
  // Called after each turn ends, serialized; a session that ends early counts its unsent turns as done.
  std::function<void(int32_t done, int32_t total)> on_progress;
  const std::atomic<bool>* stop = nullptr;  // set: no further turn starts
};

// "s<seed>-<index>".
std::string SessionId(uint64_t seed, int32_t index);

// The user messages of a file: JSON lines, each a string or an object with "content" (or "prompt",
// as a prompts file's line). Errors name the file and line.
absl::StatusOr<std::vector<std::string>> LoadUserMessages(const std::string& path);

// A run's requests and results, turn t of session s at s * turns + t. Sized at construction, so
// that a client that knows a request by its place in `requests` (experiments' in-process client)
// can be made over it before the run; each slot is written by its session's thread alone.
struct ConversationRun {
  explicit ConversationRun(const ConversationOptions& opt);

  int32_t turns = 0;
  std::vector<LoadRequest> requests;    // [sessions * turns]: what each turn sent
  std::vector<RequestResult> results;   // [sessions * turns]
  std::vector<int32_t> endpoints;       // [sessions * turns]: the endpoint's index; -1: never sent
  double duration_s = 0;                // from the start to the end of the last turn
  double start_s = 0;                   // the start, on the steady clock; send times count from it
  int32_t sessions_completed = 0, sessions_failed = 0;  // failed: a turn failed or was refused

  // The slots of the turns sent, in the order sent.
  std::vector<size_t> SentOrder() const;
  // Their results in the same order, as a RunResult (for Summarize and traces).
  RunResult Sent() const;
};

// Runs every session, turn by turn, each turn through clients[RouteTurn(...)]. A turn that fails
// (or is refused) ends its session, never the run. `run` must be made from the same options.
void RunConversations(const std::vector<LoadClient*>& clients, const ConversationOptions& opt, ConversationRun* run);

// The statistics of turn index `turn` over every session that sent it.
struct TurnSummary {
  int32_t turn = 0;
  int32_t sent = 0, completed = 0, failed = 0;  // failed counts refusals too
  Stats ttft_ms;                                 // over completed turns
  double mean_prompt_tokens = 0, mean_cached_tokens = 0, mean_output_tokens = 0;  // over completed turns
};
std::vector<TurnSummary> SummarizeTurns(const ConversationRun& run);  // [turns]

// Where the sessions' turns landed, by the replica each answer named (RequestResult::replica).
struct SessionReplicas {
  std::map<std::string, int32_t> first_turns;  // by replica: the sessions whose turn 0 it answered
  int32_t moved = 0;  // sessions whose completed turns named more than one replica
  int32_t FirstTurnsOf(const std::string& replica) const {  // 0 for a replica that answered no turn 0
    const auto it = first_turns.find(replica);
    return it == first_turns.end() ? 0 : it->second;
  }
};
SessionReplicas SummarizeSessionReplicas(const ConversationRun& run);

// [turns] objects {"turn", "sent", "completed", "failed", "mean_ttft_ms", "median_ttft_ms",
// "p90_ttft_ms", "mean_prompt_tokens", "mean_cached_tokens", "mean_output_tokens"}: bench-serve's
// "per_turn" and an experiment's results line's.
nlohmann::json TurnsJson(const std::vector<TurnSummary>& turns);

}  // namespace specula

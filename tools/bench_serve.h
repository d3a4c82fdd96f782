// `specula bench-serve`: drives a running `specula serve` (or any OpenAI-compatible server) with a
// request schedule and reports throughput and latency, as `vllm bench serve` does (serving/load_gen).
#pragma once

#include "absl/status/status.h"

namespace specula {

inline constexpr char kBenchServeUsage[] = R"(usage: specula bench-serve --endpoint grpc://HOST:PORT|http://HOST:PORT [flags]

Sends --num-prompts requests on a schedule, streams every response, and prints a table of
throughput and latency (TTFT, TPOT, ITL, end-to-end), as `vllm bench serve` does. gRPC uses
specula.v1.Generation/Generate; HTTP uses POST /v1/completions with "stream": true.

  --endpoint URL          grpc://HOST:PORT or http://HOST:PORT (required)
  --model NAME            HTTP model name (default: data[0].id of GET /v1/models)
  --num-prompts N         requests to send (default 100)
  --request-rate R        arrivals per second, or inf: all at once (default inf)
  --burstiness B          gamma shape of the gaps between arrivals, mean 1/R: 1 = Poisson,
                          < 1 burstier, > 1 steadier (default 1)
  --max-concurrency C     most requests in flight; later arrivals wait (default: no limit,
                          which here means 512 threads)
  --burst-factor F        chaos drill: the rate is R*F during [S, S+D) seconds from the start
  --burst-start-s S       (default 0)
  --burst-duration-s D    (required with --burst-factor)

Prompts (synthetic unless --dataset-path):
  --dataset-path FILE     JSON lines {"prompt": ..., "max_tokens": ..., "priority": ...}, as generate
                          --prompts-file; reused in order when shorter than --num-prompts
  --input-len L           synthetic: L random token ids per prompt (default 128)
  --output-len O          synthetic: exactly O new tokens (ignore_eos; default 128); with a dataset,
                          max_tokens for lines without one
  --vocab-size V          synthetic token ids in [0, V) (default: the server's, or 256 over HTTP)

  --temperature T         sampling temperature (default 0)
  --request-timeout-s S   per-request deadline (default 600)
  --api-key KEY           the server's key, sent as `Authorization: Bearer KEY` (gRPC: metadata);
                          default $OPENAI_API_KEY, as vllm bench serve
  --goodput SLOS          e.g. --goodput ttft:500 tpot:50 (ms; keys ttft, tpot, e2el): request
                          goodput counts the requests that meet every one
  --seed S                seed of the schedule and the synthetic prompts (default 0)
  --result-json FILE      write every metric and the parameters as one JSON object
  --save-detailed         also per-request arrays in --result-json ("request_replicas": each
                          one's replica, "request_answered_by": the path that answered it, model
                          or faq, "request_model_versions": the model's version; "" where it named
                          none)
  --no-progress           no progress bar on stderr

Multi-turn conversations (--multi-turn; docs/multi_turn.md): closed-loop sessions instead of a
schedule. Each turn sends the whole history, the answer received and a new user message: HTTP as
POST /v1/chat/completions ("messages", streamed, usage from the last chunk), gRPC as one prompt
of the messages' contents, one per line. The session id ("s<seed>-<i>") travels in the
X-Session-Id header (HTTP) or x-session-id metadata (gRPC). A failed turn ends its session only.
  --multi-turn            run sessions (the schedule's and the prompts' flags above do not apply)
  --endpoint A,B,...      several endpoints: each turn goes to one, by --turn-routing
  --num-sessions N        sessions to run (default 8)
  --turns T               turns per session (default 4)
  --session-concurrency C sessions in flight at once (default: all of them, 512 at most)
  --think-time-s S        pause between an answer and the session's next turn (default 0)
  --user-messages FILE    JSON lines, each a string or {"content": ...} ({"prompt": ...} too):
                          the new user messages, cycled (turn t of session s takes line s*T+t)
  --user-words W          without --user-messages: W random common words per user message (default 16)
  --system-prompt TEXT    a system message first in every session (default: none)
  --max-tokens N          max_tokens of each answer (default 128)
  --ignore-eos            every answer runs to --max-tokens
  --turn-routing R        session: a session stays on endpoint hash(id) mod n (default);
                          rotate: turn t of session s goes to endpoint (s + t) mod n
  The summary adds sessions completed and ended, and per turn index the TTFT (mean, p50, p90) and
  the mean prompt, cached (prefix cache) and output tokens; --save-detailed writes every turn
  (session id, turn, endpoint, replica, model version, TTFT, E2E, tokens, outcome) under "requests" in
  --result-json. Per replica it adds the sessions whose first turn it answered ("sessions"), and
  "sessions_moved": sessions whose completed turns named more than one replica.

Refusals (gRPC RESOURCE_EXHAUSTED, HTTP 429) are counted as rejected, apart from other failures.
Failures are counted by cause (the error's first 120 bytes: "failed_by_error"; printed most frequent
first). Each response's replica is read from X-Specula-Replica (HTTP) or x-specula-replica metadata
(gRPC), as `specula serve --replica-id` sends them: where any request named one, the summary counts
requests, ok, rejected and failed per replica ("replicas"; "requests_without_replica": the others).
"answered_by" counts the completed requests by the path the server named (X-Specula-Answered-By,
x-specula-answered-by: model, or faq under `specula serve --degrade faq`), "model_versions" by the
model version (X-Specula-Model-Version, x-specula-model-version).
With speculation a message can carry several tokens: ITL is measured per message.
)";

// Exits through the status: a bad flag names the flag and its value; an unreachable endpoint is one
// line naming it.
absl::Status RunBenchServe(int argc, char** argv);

}  // namespace specula

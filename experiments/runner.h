// One run of one point of an experiment: the engine the point describes, the spec's workload
// through it (offline: every request at t = 0 straight into the engine; online: at the point's
// request rate through the serving core and bench-serve's load generator, or against the spec's
// endpoint; a conversation workload: its sessions, closed loop), and the measurements as one
// results.jsonl object.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dist/communicator.h"
#include "engine/options.h"
#include "experiments/spec.h"
#include "nlohmann/json.hpp"
#include "serving/load_gen.h"

namespace specula {
struct DraftProfile;  // sim/acceptance.h
}

namespace specula::experiments {

struct RunHooks {
  const std::atomic<bool>* stop = nullptr;  // set (Ctrl-C): the run ends early with CancelledError
  std::function<void(int32_t done, int32_t total)> on_progress;  // requests finished; from any thread
  // Tensor parallelism (`experiment run --tensor-parallel-size N`): the group every local point's
  // engine is sharded over, and a call with the point's engine options just before it loads (rank 0
  // sends them to the other ranks, which load the same engine); an error fails the run.
  std::shared_ptr<Communicator> group;
  std::function<absl::Status(const EngineOptions&)> before_load;
  // ONLINE (the spec's record_trace): where the run writes its per-request trace (TraceJsonl), whole
  // (a temporary file renamed) before RunPoint returns; its directory must exist. Empty: no trace.
  std::string trace_path;
};

// The measurements of one run (results.jsonl's fields after "key", "repeat" and "point"):
// completed, rejected, failed, duration_s, request_throughput, output_tok_s, total_tok_s,
// input_tokens, output_tokens, ttft_ms / tpot_ms / e2e_ms {mean, p50, p99}, spec {drafts,
// draft_tokens, accepted_tokens, mean_acceptance_length, acceptance_per_position}, k_histogram
// (auto only), peak_kv_usage, preemptions, steps, and output_hash: a hash of every request's tokens
// in order, equal for equal outputs (null against an endpoint, whose tokens are not seen here);
// goodput (the share of num_requests that completed within every bound of the spec's slo, each
// request on its own; with no bound, the completed share; OFFLINE, TTFT includes the wait in the
// queue) and request_goodput (those per second); a conversation adds sessions {completed, failed}
// and per_turn (serving/conversation.h's TurnsJson).
absl::StatusOr<nlohmann::json> RunPoint(const LoadedSpec& spec, const Point& point, const RunHooks& hooks);

// A run's trace, one JSON line per request in arrival order: {"arrival_s": the send time from the
// run's start, "prompt_id": the first request with the same prompt (a repeated prompt is what the
// prefix cache serves), "prompt_tokens", "prompt_text" (sent as text, else as token ids),
// "output_tokens", "ttft_ms" (null when no token came), "e2e_ms" and "finish_s" = arrival_s + e2e
// (null unless it completed), "ok"}, plus "error" when not ok; and for an n-gram point,
// "drafts_found" and "drafts_matched": what the lookup found at each decode step and how many of
// those the output matched (experiments/draft_profile.h), which `specula simulate` replays. A
// conversation's turn adds "session" (its session's number: the simulator's session affinity),
// "session_id" and "turn" after "arrival_s", and "cached_tokens" (the prefix cache's, as the server
// said) after "prompt_tokens"; "endpoint" where `endpoints` is given.
// `requests`: what was sent, in the same order; `drafts`, `endpoints`: [requests] or empty.
std::string TraceJsonl(const RunResult& run, const std::vector<LoadRequest>& requests,
                       absl::Span<const DraftProfile> drafts = {}, absl::Span<const std::string> endpoints = {});

}  // namespace specula::experiments

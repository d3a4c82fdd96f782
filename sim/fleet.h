// A discrete-event simulation of a fleet of replicas behind a router: arrivals and step ends in
// time order, each replica's steps from sim/replica.h. It reports what `bench-serve` reports, per
// replica and for the fleet, reduced the same way (core/stats.h). Deterministic: the same inputs
// and seed give the same records, byte for byte.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/arrivals.h"
#include "core/stats.h"
#include "sim/replica.h"

namespace specula {

enum class Routing { kRoundRobin, kLeastOutstanding, kSessionAffinity };
absl::StatusOr<Routing> ParseRouting(const std::string& name);  // "round_robin", "least_outstanding", "session"
const char* RoutingName(Routing r);

// Requests of a synthetic workload: arrivals from `arrivals`, lengths fixed or drawn uniformly in
// [len * (1 - spread), len * (1 + spread)], and sessions: request i belongs to session
// i % num_sessions (0: none), sharing `prefix_reuse` of its prompt with the session's last one.
struct SyntheticWorkload {
  ArrivalOptions arrivals;
  int32_t prompt_len = 128, output_len = 128;
  double len_spread = 0;
  int32_t num_sessions = 0;
  double prefix_reuse = 0;
};
std::vector<SimRequest> MakeRequests(const SyntheticWorkload& w);
// A trace: JSONL of {"arrival_s", "prompt_tokens", "output_tokens"[, "prompt_id"][, "session"]
// [, "prompt_text"][, "drafts_found", "drafts_matched"]} (an experiment's traces/*.jsonl have these; equal
// prompt_ids are the same prompt, which the prefix cache serves; prompt_text false: token ids were
// sent, which cost an arrival less than text to tokenize; the drafts are an n-gram run's
// DraftProfile, output_tokens - 1 entries each). A line with "ok": false and no tokens counted (a
// request the server refused) still arrives, with the lengths of a completed request of the same
// prompt, else the completed requests' medians; `note`, if given, says how many. Errors name the
// line and the field.
absl::StatusOr<std::vector<SimRequest>> LoadTrace(const std::string& path, std::string* note = nullptr);
// `fallback` wrapped to replay the requests' draft profiles, where any has one; else `fallback`.
std::unique_ptr<AcceptanceModel> WithDraftProfiles(const std::vector<SimRequest>& requests,
                                                   std::unique_ptr<AcceptanceModel> fallback);

struct FleetConfig {
  int32_t replicas = 1;
  Routing routing = Routing::kLeastOutstanding;
  ReplicaConfig replica;
  uint64_t seed = 0;
  bool record_steps = false;  // keep every replica's steps (tests)
};

struct SimSummary {
  int32_t requests = 0, completed = 0, refused = 0;
  std::map<std::string, int32_t> refusals;  // by admission's reason
  double duration_s = 0;                     // from 0 to the last completion (or arrival)
  double request_throughput = 0, output_tok_s = 0;
  double goodput = 0;          // share of all requests that completed within every SLO bound
  double request_goodput = 0;  // such requests per second
  Stats ttft_ms, tpot_ms, itl_ms, e2e_ms;
  double kv_usage_mean = 0, kv_usage_peak = 0;  // share of the KV pool, time-weighted mean and peak
  int64_t preemptions = 0, steps = 0;
  double mean_k = 0;  // drafts per decoding sequence-step (0 without speculation)
  int64_t draft_tokens = 0, accepted_tokens = 0;  // drafts verified, and of those accepted
};

struct FleetResult {
  std::vector<std::unique_ptr<Replica>> replicas;  // their records and steps
  SimSummary fleet;
  std::vector<SimSummary> per_replica;
};

// Runs `requests` (sorted by arrival) through the fleet until every one has finished or been refused.
FleetResult Simulate(const FleetConfig& config, const std::vector<SimRequest>& requests, AcceptanceModel* acceptance,
                     const GoodputSlo& slo);

}  // namespace specula

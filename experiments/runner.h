// One run of one point of an experiment: the engine the point describes, the spec's workload
// through it (offline: every request at t = 0 straight into the engine; online: at the point's
// request rate through the serving core and bench-serve's load generator, or against the spec's
// endpoint), and the measurements as one results.jsonl object.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dist/communicator.h"
#include "engine/options.h"
#include "experiments/spec.h"
#include "nlohmann/json.hpp"

namespace specula::experiments {

struct RunHooks {
  const std::atomic<bool>* stop = nullptr;  // set (Ctrl-C): the run ends early with CancelledError
  std::function<void(int32_t done, int32_t total)> on_progress;  // requests finished; from any thread
  // Tensor parallelism (`experiment run --tensor-parallel-size N`): the group every local point's
  // engine is sharded over, and a call with the point's engine options just before it loads (rank 0
  // sends them to the other ranks, which load the same engine); an error fails the run.
  std::shared_ptr<Communicator> group;
  std::function<absl::Status(const EngineOptions&)> before_load;
};

// The measurements of one run (results.jsonl's fields after "key", "repeat" and "point"):
// completed, rejected, failed, duration_s, request_throughput, output_tok_s, total_tok_s,
// input_tokens, output_tokens, ttft_ms / tpot_ms / e2e_ms {mean, p50, p99}, spec {drafts,
// draft_tokens, accepted_tokens, mean_acceptance_length, acceptance_per_position}, k_histogram
// (auto only), peak_kv_usage, preemptions, steps, and output_hash: a hash of every request's tokens
// in order, equal for equal outputs (null against an endpoint, whose tokens are not seen here).
absl::StatusOr<nlohmann::json> RunPoint(const LoadedSpec& spec, const Point& point, const RunHooks& hooks);

}  // namespace specula::experiments

// Prometheus /metrics text (exposition format 0.0.4) under vLLM's metric names, so that dashboards
// built for vLLM work once `vllm:` is replaced by `specula:`.
//
// Names, HELP texts, label names (`model_name`, `engine`, then `finished_reason` / `position`) and
// histogram buckets follow vLLM V1's PrometheusStatLogger in vllm/v1/metrics/loggers.py (commit
// 005a810bc40f, the v0.10 line: per-engine `engine` label, kv_cache_usage_perc and prefix_cache_*
// next to their deprecated gpu_* names), the spec-decode counters in vllm/v1/spec_decode/metrics.py
// (SpecDecodingProm) and the observation points in vllm/v1/metrics/stats.py (IterationStats).
// Deprecated gpu_* aliases are left out. Numbers are written the way prometheus_client writes them
// ("3.0", "+Inf", "1e+06"), so `le` label values are the same strings vLLM exposes.
//
// Ours, not vLLM's: the label model_version (the served weights' version: specula serve
// --model-version) after model_name on every series; specula:replica_info{replica} (1, with --replica-id's value, so that a fleet's
// series can be joined on it); specula:admission_rejected_total{reason}; structured output's drafts,
// specula:spec_decode_num_forced_draft_tokens_total, spec_decode_num_accepted_forced_tokens_total
// and spec_decode_num_grammar_cut_tokens_total; the shared KV store's specula:kv_store_*_total
// (fetches, hit and miss blocks, read and written bytes, writes, dropped writes, timeouts, errors,
// fetch seconds, installed and rejected blocks, install seconds; zero without --kv-store). The
// spec-decode counters are exported whether or not the server has a proposer: a constrained
// request's grammar forces drafts without one.
// No gRPC or HTTP types here: the front end serves RenderFrom()'s text.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "serving/engine_loop.h"

namespace specula {

class ServingMetrics {
 public:
  // What the exposition names besides the counts.
  struct Options {
    // > 0: vLLM's request_prompt_tokens / request_generation_tokens histograms, whose 1-2-5 buckets
    // stop at max_model_len (as vLLM's do).
    int32_t max_model_len = 0;
    std::string replica_id;     // non-empty: the gauge replica_info{replica="ID"} 1
    std::string model_version;  // non-empty: the label model_version="V" on every series
    // The paths shown at 0 for each admission reason (queue_len, queue_delay, ttft_slo) before any
    // request goes over a limit.
    std::vector<std::string> degrade_paths = {"refuse"};
  };
  // model_name: the `model_name` label's value. rejection_reasons: reasons shown at 0 before any
  // rejection.
  ServingMetrics(std::string model_name, std::vector<std::string> rejection_reasons, Options options);
  ServingMetrics(std::string model_name, std::vector<std::string> rejection_reasons)
      : ServingMetrics(std::move(model_name), std::move(rejection_reasons), Options{}) {}

  // A request that ran ended (any reason, aborted ones too). Thread-safe. Counts its prompt and
  // generated tokens, its finish reason ("stop", "length", "abort"; kError is not counted there),
  // and observes TTFT (if a token came), the end-to-end latency, and time_per_output_token once
  // per step that brought tokens after the first (as vLLM: a speculative step's tokens make one).
  // The phases, as vLLM's IterationStats: request_queue_time_seconds, WAITING from arrival to the
  // first step that scheduled it (to its end if none did: aborted while waiting), for every
  // request; and for those that got a token, request_prefill_time_seconds (scheduled to first
  // token), request_decode_time_seconds (first to last token) and
  // request_inference_time_seconds (scheduled to last token); preemptions count in the phase
  // they interrupt.
  void OnFinished(const RequestOutput& out);
  // Admission control refused a request. Thread-safe.
  void OnRejected(const std::string& reason);
  // A request went over admission limit `reason` and `path` answered it ("refuse": the refusal that
  // OnRejected counts too; "faq": the degrade path's table). Thread-safe.
  void OnDegraded(const std::string& reason, const std::string& path);
  // An FAQ answer went out (--degrade faq): the seconds from its request reaching a handler to the
  // answer's bytes about to be queued to the client (counted before they go). Thread-safe.
  void OnFaqAnswered(double seconds);
  // A reload made `version` the served one: every series carries it from now on. The engine's own
  // counters (spec decode, prefix cache, preemptions) start again with the new engine; the rest
  // carry on. Thread-safe.
  void SetModelVersion(std::string version);

  // The whole exposition: gauges and engine-wide counters (preemptions, prefix cache, spec decode)
  // from the engine's snapshot, the rest from what OnFinished / OnRejected recorded. The snapshot is
  // taken while those are held, so it is never older than the outputs counted: the engine loop
  // publishes a step's snapshot before its outputs (a snapshot taken first could still show the KV
  // blocks of a request already counted as aborted). `snapshot` must not call back into this.
  std::string RenderFrom(const std::function<EngineSnapshot()>& snapshot) const;
  std::string Render(const EngineSnapshot& snapshot) const {
    return RenderFrom([&snapshot] { return snapshot; });
  }

 private:
  // Counts per bucket (not cumulative; the last one is +Inf), the sum and the count.
  struct Histogram {
    std::vector<double> bounds;
    std::vector<int64_t> counts;
    double sum = 0;
    int64_t count = 0;
    explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
    void Observe(double v);
  };

  const std::string model_name_;
  const std::string replica_id_;     // empty: no replica_info
  std::string model_version_;  // empty: no model_version label; guarded by mu_
  const bool token_histograms_;
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;            // guarded by mu_
  std::map<std::string, int64_t> finished_;  // by OpenAI finish name; guarded by mu_
  std::map<std::string, int64_t> rejected_;                       // guarded by mu_
  std::map<std::pair<std::string, std::string>, int64_t> degraded_;  // (reason, path); guarded by mu_
  Histogram ttft_, itl_, e2e_, prompt_len_, generation_len_;      // guarded by mu_
  Histogram queue_, prefill_, decode_, inference_;                // guarded by mu_
  Histogram faq_answer_;                                          // guarded by mu_
};

}  // namespace specula

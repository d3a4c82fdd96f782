// Experiment specs (experiments/experiment.proto, written as textproto): parsing with the error's
// file, line and column, validation before anything runs, and the sweep's points.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "experiments/experiment.pb.h"
#include "nlohmann/json.hpp"
#include "serving/conversation.h"
#include "serving/load_gen.h"

namespace specula::experiments {

using v1::Experiment;

// A parsed and validated spec, its paths resolved against the spec file's directory and its
// defaults filled in (num_requests, max_tokens, repeats, max_spec_tokens, each empty sweep field).
struct LoadedSpec {
  std::string path;  // the spec file, as given
  std::string text;  // its contents
  Experiment spec;   // resolved, defaults filled
  std::string hash;  // of `spec`: a changed spec has another (comments and layout do not count)
  std::vector<LoadRequest> prompts;  // the prompts file's lines, read once (empty: synthetic)
  std::vector<std::string> user_messages;  // a conversation's user_messages_file, read once
};

// Errors name the spec's file, line and column (1-based): "spec.textproto:7:3: sweep.max_num_seqs[1]:
// -8 is not in [1, 1024]". Files the spec names must exist; a prompts file must parse.
absl::StatusOr<LoadedSpec> LoadSpec(const std::string& path);
// The same for a spec held in memory (`path` is only for messages and relative paths).
absl::StatusOr<LoadedSpec> ParseSpec(const std::string& path, const std::string& text);

// One point of the sweep: one engine configuration (in process) or one client setting (endpoint).
struct Point {
  bool online = false;
  bool remote = false;  // against a spec's endpoint: the engine fields are the server's, not recorded
  int32_t max_num_seqs = 64;
  std::string spec_method = "none";
  std::optional<int32_t> num_spec_tokens;  // k, 0 = auto; none without speculation
  double temperature = 0;
  int32_t max_num_batched_tokens = 2048;
  std::string kv_cache_dtype = "bf16", quantization = "none";
  std::optional<double> request_rate, burstiness;  // online only
  std::optional<double> burst_factor;              // online only; 1 = no burst
  double burst_start_s = 0, burst_duration_s = 0;  // the spec's burst window (online)

  // Canonical and unique within a sweep: "max_num_seqs=8,spec_method=draft,num_spec_tokens=4,...";
  // burst_factor appears only when it is not 1, so that keys of specs without bursts stay as they were.
  std::string Key() const;
  // The parameters as results.jsonl's "point" object.
  nlohmann::json Json() const;
  // "draft k=4", "ngram auto", "none".
  std::string Label() const;
};

// The cartesian product of the sweep, each combination once: spec_method "none" ignores k, a spec
// with an endpoint varies only temperature, request_rate, burstiness and burst_factor, and a
// conversation's points have no arrival parameters (closed loop).
std::vector<Point> ExpandSweep(const Experiment& spec);

// The spec as JSON, with the proto's field names (for run.json).
nlohmann::json SpecJson(const Experiment& spec);

}  // namespace specula::experiments

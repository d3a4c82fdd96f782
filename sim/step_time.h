// How long a step takes, for the serving simulator: a model of one forward's time from the work
// the scheduler planned (sequences, new tokens, logits rows, attended positions), fitted to
// measured steps or derived from a roofline. Every prediction carries where it comes from
// (measurement, calibration or roofline), so that a plan can say which of its figures rest on what.
//
//   seconds = T(tokens) + a * rows + b * positions + c * seqs
//
// T is piecewise linear in the step's tokens, with knots at the powers of 2 within the samples'
// range: a step is bound by reading the weights at a few tokens and by arithmetic at many, and
// where it turns depends on the machine. rows price the classifier and the host's work per logits row
// (sampling, verification); positions price attention, which grows with the context, not the
// tokens; seqs the per-sequence host work (block tables, outputs).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/forward_work.h"
#include "core/step.h"

namespace specula {

// One forward's work (core/forward_work.h's axes plus the sequences).
struct StepWork {
  double seqs = 0, tokens = 0, rows = 0, positions = 0;
};

// A step plan's target forward as the engine runs it: every scheduled token, one logits row per
// sequence (1 + k for a verification of k drafts), and the positions attended. `drafts` gives the
// drafts a sequence actually carried where a proposer gave fewer than the plan's slots ([seqs];
// empty: the plan's num_spec).
StepWork PlanWork(const StepPlan& plan, const std::vector<int32_t>& drafts = {});
// The work of a step the engine ran: PlanWork with the drafts each sampling sequence's output says
// it verified.
StepWork RanWork(const StepPlan& plan, const StepResult& result);
// "prefill" (a step with a prompt chunk), "verify" (drafts verified) or "decode".
const char* StepKind(const StepPlan& plan, const StepWork& w);

enum class CostOrigin { kMeasured, kCalibrated, kRoofline };
// "measured" (tables measured on that hardware), "calibrated" (a profile measured here by
// `specula experiment calibrate`), "roofline" (peak FLOPs and bandwidth: never measured).
const char* CostOriginName(CostOrigin o);

struct StepSample {
  StepWork work;
  double seconds = 0;
};

struct DeviceSpec;

class StepTimeModel {
 public:
  // Least squares over the samples (at least 2 distinct token counts). Errors: too few samples, a
  // sample that is not finite or not positive.
  static absl::StatusOr<StepTimeModel> Fit(const std::vector<StepSample>& samples, CostOrigin origin,
                                           std::string description);
  StepTimeModel() = default;

  double Seconds(const StepWork& w) const;
  // A step's time with the variation steps of one shape show (the measured times over the fit's, as
  // quantiles: the host's other threads, the cache, the clock): Seconds times a draw from them, whose
  // mean is 1. Without a measured variation, Seconds.
  double Draw(const StepWork& w, std::mt19937_64& rng) const;
  // Sets the variation from measured-over-predicted ratios (any order; kept as kJitterQuantiles,
  // scaled to mean 1; empty: none).
  void SetJitter(std::vector<double> ratios);
  bool has_jitter() const { return !jitter_.empty(); }
  // Times a multiplier (a what-if: a slower machine, or a measured correction).
  void Scale(double factor) { scale_ *= factor; }

  CostOrigin origin() const { return origin_; }
  const std::string& description() const { return description_; }  // what it was fitted to
  // The largest token count it was fitted on: past it T is the last segment's line.
  double max_tokens() const { return knots_.empty() ? 0 : knots_.back(); }

 private:
  friend StepTimeModel RooflineModel(const ForwardShape&, double, double, const DeviceSpec&);
  // A roofline instead of a fit: max(FLOPs / flops_per_s, bytes / bytes_per_s) + fixed + per_row * rows.
  struct Roofline {
    ForwardShape shape;
    double weight_bytes = 0, kv_bytes_per_position = 0, flops_per_s = 0, bytes_per_s = 0, fixed = 0, per_row = 0;
  };
  std::optional<Roofline> roofline_;
  std::vector<double> knots_;  // token counts, increasing; T's breakpoints
  std::vector<double> coef_;   // [intercept, tokens, hinge per inner knot..., rows, positions, seqs]
  double scale_ = 1.0;
  static constexpr size_t kJitterQuantiles = 256;
  std::vector<double> jitter_;  // [kJitterQuantiles] increasing, or empty
  CostOrigin origin_ = CostOrigin::kRoofline;
  std::string description_;
};

// A device's peaks for a roofline, and the part of them a step reaches.
struct DeviceSpec {
  std::string name;
  double peak_flops = 0;      // dense, in the weights' compute dtype
  double bandwidth = 0;       // bytes/s
  double memory_bytes = 0;    // for the KV pool left beside the weights
  double compute_efficiency = 0.6, bandwidth_efficiency = 0.8;
  double step_overhead_s = 0; // launches and host work per step
  double per_row_s = 0;       // host work per logits row (sampling, verification)
};

// "h100", "h200", "a100", "cpu-avx512-2core": the datasheets' peaks. Errors name the device and
// list the known ones.
absl::StatusOr<DeviceSpec> NamedDevice(const std::string& name);

// A model's shape by name ("llama-3.1-8b", "llama-3.2-1b", "llama-3.1-70b", "qwen2.5-7b",
// "smollm2-135m"); the bytes per weight are the caller's (2 for bf16). Errors list the known ones.
absl::StatusOr<ForwardShape> NamedForwardShape(const std::string& name);
// Weights of a shape, in parameters (the classifier counted once: tied or not, it is read once).
double ShapeParameters(const ForwardShape& s);

// A roofline model of `shape` on `device`: max(FLOPs / achieved peak, bytes / achieved bandwidth)
// + overheads, where the bytes are the weights (read once a step) and the KV read by attention.
StepTimeModel RooflineModel(const ForwardShape& shape, double bytes_per_weight, double kv_bytes_per_value,
                            const DeviceSpec& device);

}  // namespace specula

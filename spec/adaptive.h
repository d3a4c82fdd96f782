// Adaptive speculation (--num-spec-tokens auto) as one object with two calls: Choose lowers each
// decoding sequence's drafts in a step's plan to the k that maximizes the step's expected goodput
// (spec/controller.h), and Observe learns from the step as it ran: each request's acceptance, the
// cost tables' factors, and, within a small share of the steps' time, the next larger shape of the
// target's or the draft's forward. It owns the controller, its cost tables and their measurement,
// and includes only core/: the model's forwards are measured through the functions it is given, so
// that a simulator runs it without a model. Its tuning constants are in spec/tuning.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/clock.h"
#include "core/forward_work.h"
#include "core/step.h"
#include "spec/controller.h"

namespace specula {

// Times a model's forwards on a grid (model/forward_cost.h: MeasureForwardCost); every point so far.
using MeasureCostFn = std::function<absl::StatusOr<std::vector<CostPoint>>(const CostGrid&)>;

struct AdaptiveConfig {
  int32_t max_num_seqs = 64;
  int32_t block_size = 16;
  int32_t max_spec_tokens = 8;       // the scheduler's num_spec_tokens: the most drafts a sequence gets
  double calibration_seconds = 1.0;  // a shape longer than this is not measured
  // Measurements to use instead of measuring (the draft's ignored without a draft model), and
  // whether step timings refine them: fixed costs make the choices reproducible (tests, cost studies).
  std::optional<std::vector<CostPoint>> target_cost, draft_cost;
  bool refine_cost = true;
  // Times the measurements (null: the steady clock). The simulator's clock advances by the time a
  // measurement would take, so that its choices are the engine's, and reproducible.
  Clock* clock = nullptr;
};

// The step as it ran, for Observe.
struct StepTiming {
  double tokens = 0, rows = 0, positions = 0;  // the target's forward (core/forward_work.h)
  double seconds = 0;                          // the whole step so far
  double propose_seconds = 0;                  // of which drafting
};

class AdaptiveSpeculation {
 public:
  // Measures the target's forwards of 1 to 8 tokens and the draft's one-token forward (draft_shape
  // empty: a proposer without a model, which costs nothing). If no acceptance would make drafts
  // pay, drafts_cannot_pay() is set and Choose always gives 0. Otherwise the draft's forwards of up
  // to 8 tokens are measured and, for batches of up to 8 sequences, the target's forward of twice
  // the batch (one draft each); larger shapes (up to 512 tokens) follow between steps, one at a
  // time, while measuring stays under a small share of the steps' time.
  static absl::StatusOr<std::unique_ptr<AdaptiveSpeculation>> Create(const AdaptiveConfig& config,
                                                                      const ForwardShape& target,
                                                                      std::optional<ForwardShape> draft_shape,
                                                                      MeasureCostFn measure_target,
                                                                      MeasureCostFn measure_draft);

  // Lowers the draft slots of the plan's candidates (sequences the scheduler made room for drafts)
  // to the chosen k, 0 included.
  void Choose(StepPlan* plan, absl::Span<const SpecCandidate> candidates);
  // Learns from the step that ran `plan` (after Choose) with `candidates`: acceptance from
  // `result`, the costs from `timing`; then measures the next shape if one is due.
  void Observe(const StepPlan& plan, absl::Span<const SpecCandidate> candidates, const StepResult& result,
               const StepTiming& timing);
  // Measures now every shape that Observe would measure later, between steps (up to the largest):
  // for timed runs, whose steps should not carry the measurement's forwards. With a cost cache, the
  // shapes another process measured cost nothing.
  void MeasureRemaining();

  bool drafts_cannot_pay() const { return drafts_cannot_pay_; }
  double measure_seconds() const { return measure_seconds_; }  // at startup and between steps
  int32_t measured_tokens() const { return target_meter_.tokens; }  // the target's largest measured forward
  const SpecController& controller() const { return *controller_; }

 private:
  // One model's lazily measured forwards: the largest shape so far and its time.
  struct Meter {
    int32_t tokens = 0;
    double seconds = 0;
    bool done = true;  // nothing more to measure (or the costs were given)
    MeasureCostFn measure;
  };
  AdaptiveSpeculation(const AdaptiveConfig& config, const ForwardShape& target)
      : config_(config), target_(target), clock_(config.clock != nullptr ? config.clock : DefaultClock()) {}
  absl::Status Calibrate(std::optional<ForwardShape> draft_shape);
  // Measures m's next shape and gives the controller the larger table; false: nothing more to measure.
  bool MeasureNext(Meter* m);
  // After a step of `step_seconds`: the next shape, if its time stays within its share.
  void MeasureMore(double step_seconds);

  const AdaptiveConfig config_;
  const ForwardShape target_;
  Clock* const clock_;
  std::unique_ptr<SpecController> controller_;
  CostGrid grid_;
  Meter target_meter_, draft_meter_;
  bool drafts_cannot_pay_ = false;
  double measure_seconds_ = 0;
  double step_seconds_ = 0, between_steps_seconds_ = 0;  // time in steps, and measuring between them
};

}  // namespace specula

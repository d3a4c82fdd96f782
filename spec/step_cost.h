// The predicted time of a forward (the target's step, or one of the draft's forwards), for adaptive
// speculation: a table of times by work (FLOPs, core/forward_work.h), interpolated linearly
// between its points and extended past the last one by the last segment's slope or in proportion to
// work, whichever is larger, times a factor that follows the engine's own measured steps.
//
// The table carries the shape. A decode step is bound by reading the weights at one token and by
// arithmetic at many, and where between it turns depends on the machine: a line fitted to the
// steps the engine happens to run cannot tell a fixed cost from a per-token one when those steps
// all have the same size (it overestimated plain decode steps by 60% once every step verified one
// draft). The factor (an average of measured over predicted: of every step at first, then of the
// last ~30) carries what the table does not: the machine's load of the moment and the host work
// around a forward.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/forward_work.h"

namespace specula {

class StepCost {
 public:
  // A model that predicts zero (a proposer without a model costs nothing).
  StepCost() = default;
  // Points in any order; equal works are merged (the faster kept).
  explicit StepCost(std::vector<CostPoint> points) { SetPoints(std::move(points)); }
  // A new table (more shapes measured); the factor is kept.
  void SetPoints(std::vector<CostPoint> points);

  double Predict(double flops) const { return factor_ * Table(flops); }
  // Predict with the table extended past its last point by the last segment's line alone: the
  // cheapest the next shapes could be (while reading the weights still dominates, what they cost).
  double PredictLine(double flops) const { return factor_ * Table(flops, false); }
  // A measured forward (or step) of `flops` work.
  void Observe(double flops, double seconds) { ObserveRatio(seconds / Table(flops)); }
  // Measured over predicted-by-the-table time, for several forwards measured together.
  void ObserveRatio(double ratio);
  // Moves the factor toward 1 by `rate` (in logs): what was learned fades where it is not renewed.
  void Relax(double rate) { factor_ = std::exp((1 - rate) * std::log(factor_)); }

  double factor() const { return factor_; }
  const std::vector<CostPoint>& points() const { return points_; }
  bool empty() const { return points_.empty(); }
  // The work of the largest measured forward (0: no table). Past about twice that, the table's
  // extension is a guess: the adaptive controller does not choose such steps, and such steps do
  // not teach the factor.
  double max_flops() const { return points_.empty() ? 0.0 : points_.back().flops; }

 private:
  // `proportional`: past the last point, at least in proportion to work (see Table's comment).
  double Table(double flops, bool proportional = true) const;

  std::vector<CostPoint> points_;  // by increasing work
  double factor_ = 1.0;
  int64_t observations_ = 0;
};

// A correction of predicted times by work, on top of a StepCost's factor: one multiplier at each of
// a set of works (the controller's: its table's points and midway between them), interpolated (in
// logs) between them and flat past the ends, each point learning from the measured steps around it. A factor is one number for every size; the steps a
// controller chooses between differ in size, and the table's shape can be off for them: measured on
// forwards alone at short contexts, it called verifying 4 drafts each in a batch of 8 13% cheaper
// than it ran and 1 draft each 17% dearer, so auto took 3 to 4 drafts where 2 did best.
class WorkCorrection {
 public:
  // The works of the points (any order); the curve so far carries over to them.
  void SetWorks(std::vector<double> works);
  double At(double flops) const;
  // A step of `flops` work that ran `ratio` times its prediction with this correction applied.
  void Observe(double flops, double ratio);
  // Moves every multiplier toward 1 by `rate` (in logs).
  void Relax(double rate) {
    for (double& l : log_) l *= 1 - rate;
  }

 private:
  // The bracketing points of `flops` and the second one's weight (0 past the ends).
  void Bracket(double flops, size_t* lo, size_t* hi, double* t) const;

  std::vector<double> works_;  // increasing
  std::vector<double> log_;    // [works_]: the log of each point's multiplier
};

}  // namespace specula

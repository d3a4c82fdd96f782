// The predicted time of a step, for adaptive speculation: a linear model over CostFeatures
// (model/forward_cost.h) whose coefficients start from forward passes measured at startup and
// follow the engine's own step timings from then on.
//
// The update is Bayesian least squares: the startup fit is a prior (each coefficient may move by
// about half of itself, or of the mean measured step), and observations are weighted by their
// relative error and forgotten at a fixed rate (a half-life of ~70 steps), so that the model tracks
// a machine whose load changes. A direction the steps never vary (plain decode steps all have
// tokens == rows) keeps its prior value instead of drifting, which plain recursive least squares
// with forgetting would let it do.
#pragma once

#include <array>
#include <vector>

#include "model/forward_cost.h"

namespace specula {

class StepCost {
 public:
  static constexpr int kFeatures = 4;

  // A model that predicts zero until it has a prior or observations.
  StepCost() = default;
  // Prior from measured samples (least squares, coefficients kept non-negative). With fewer
  // samples than features the unidentified coefficients are zero.
  explicit StepCost(const std::vector<CostSample>& samples);

  double Predict(const CostFeatures& x) const;
  // One measured step.
  void Observe(const CostFeatures& x, double seconds);

  const std::array<double, kFeatures>& coefficients() const { return theta_; }

 private:
  void Solve();

  std::array<double, kFeatures> prior_{};       // coefficients from the startup samples
  std::array<double, kFeatures> precision_{};   // diagonal prior precision
  std::array<double, kFeatures> theta_{};       // current coefficients
  std::array<std::array<double, kFeatures>, kFeatures> xtx_{};  // decayed, weighted sum of x x^T
  std::array<double, kFeatures> xty_{};                         // decayed, weighted sum of x y
  double scale_ = 1e-3;  // a typical step, in seconds (sets the prior width of zero coefficients)
};

// Solves the least squares problem min |A theta - y|^2 + ridge |theta|^2 over theta >= 0 for a few
// unknowns by active-set refits (exposed for tests).
std::array<double, StepCost::kFeatures> NonNegativeLeastSquares(const std::vector<CostSample>& samples,
                                                                double ridge);

}  // namespace specula

#include "spec/step_cost.h"

#include <algorithm>
#include <cmath>

#include "spec/tuning.h"

namespace specula {
namespace {

using tuning::kCorrectionRate;
using tuning::kFactorRate;
using tuning::kMaxCorrection;
using tuning::kMaxFactor;
using tuning::kMinCorrection;
using tuning::kMinFactor;

}  // namespace

void StepCost::SetPoints(std::vector<CostPoint> points) {
  points_.clear();
  std::sort(points.begin(), points.end(), [](const CostPoint& a, const CostPoint& b) { return a.flops < b.flops; });
  for (const CostPoint& p : points) {
    if (!(p.flops > 0) || !(p.seconds > 0)) continue;
    if (!points_.empty() && p.flops <= points_.back().flops * (1 + 1e-9)) {
      points_.back().seconds = std::min(points_.back().seconds, p.seconds);
      continue;
    }
    // Time never falls with more work: a noisy point is lifted to its predecessor's.
    points_.push_back({p.flops, points_.empty() ? p.seconds : std::max(p.seconds, points_.back().seconds)});
  }
}

double StepCost::Table(double flops, bool proportional) const {
  if (points_.empty()) return 0.0;
  if (points_.size() == 1) return points_[0].seconds * (proportional ? std::max(flops / points_[0].flops, 1.0) : 1.0);
  if (flops <= points_[0].flops) return points_[0].seconds;  // below the smallest forward: its time
  size_t i = 1;
  while (i + 1 < points_.size() && flops > points_[i].flops) ++i;
  const CostPoint &a = points_[i - 1], &b = points_[i];
  const double slope = (b.seconds - a.seconds) / (b.flops - a.flops);
  const double line = a.seconds + slope * (flops - a.flops);
  // Past the last point, the larger of the last segment's line and time in proportion to work: a
  // table that ends where reading the weights still dominates has a flat last segment, and its line
  // called the next sizes cheap until arithmetic took over (auto speculated on 4% of the steps of a
  // batch of 8 where every fixed k lost, with forwards of up to 8 tokens measured).
  return flops > b.flops && proportional ? std::max(line, b.seconds * flops / b.flops) : line;
}

void StepCost::ObserveRatio(double ratio) {
  if (!(ratio > 0) || !std::isfinite(ratio)) return;  // no table, or a bad timing
  // In logs: one step 3x slower (interference) moves the factor as much as one 3x faster.
  ratio = std::clamp(ratio, kMinFactor, kMaxFactor);
  // The first observation is skipped: a new engine's first forward of each kind touches its
  // buffers and KV pool for the first time (the synthetic pair's first proposal: 9 ms against
  // 1-2 ms after). The next ones are averaged (the prior 1 weighing as one), then ~30 steps: the
  // draft runs ~2.5x its table there (host work per draft token), and at 0.03 per step from 1
  // auto took ~50 steps with drafts to learn it, drafting where it lost (a run of 4,096 tokens at
  // batch 8 spent 72 steps there, at 0.8x a plain step's goodput).
  if (observations_++ == 0) return;
  const double rate = std::max(kFactorRate, 1.0 / observations_);
  factor_ = std::exp((1 - rate) * std::log(factor_) + rate * std::log(ratio));
}

void WorkCorrection::Bracket(double flops, size_t* lo, size_t* hi, double* t) const {
  *lo = *hi = 0;
  *t = 0;
  if (works_.empty() || flops <= works_.front()) return;
  if (flops >= works_.back()) {
    *lo = *hi = works_.size() - 1;
    return;
  }
  while (*hi + 1 < works_.size() && works_[*hi] < flops) ++*hi;
  *lo = *hi - 1;
  *t = std::log(flops / works_[*lo]) / std::log(works_[*hi] / works_[*lo]);
}

double WorkCorrection::At(double flops) const {
  if (works_.empty()) return 1.0;
  size_t lo, hi;
  double t;
  Bracket(flops, &lo, &hi, &t);
  return std::exp((1 - t) * log_[lo] + t * log_[hi]);
}

void WorkCorrection::SetWorks(std::vector<double> works) {
  std::sort(works.begin(), works.end());
  works.erase(std::unique(works.begin(), works.end()), works.end());
  std::vector<double> log(works.size());
  for (size_t i = 0; i < works.size(); ++i) log[i] = std::log(At(works[i]));
  works_ = std::move(works);
  log_ = std::move(log);
}

void WorkCorrection::Observe(double flops, double ratio) {
  if (works_.empty() || !(ratio > 0) || !std::isfinite(ratio)) return;
  size_t lo, hi;
  double t;
  Bracket(flops, &lo, &hi, &t);
  // Each point moves by its share of the step (its interpolation weight) at kCorrectionRate: ~20
  // steps at a point to learn it. Clamped like the factor: one 3x outlier moves it as one 1/3x.
  const double err = std::log(std::clamp(ratio, kMinFactor, kMaxFactor));
  log_[lo] += kCorrectionRate * (1 - t) * err;
  if (hi != lo) log_[hi] += kCorrectionRate * t * err;
  for (size_t i : {lo, hi}) log_[i] = std::clamp(log_[i], std::log(kMinCorrection), std::log(kMaxCorrection));
}

}  // namespace specula

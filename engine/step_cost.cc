#include "engine/step_cost.h"

#include <algorithm>
#include <cmath>

namespace specula {
namespace {

constexpr double kFactorRate = 0.03;  // per observation: ~30 steps
constexpr double kMinFactor = 0.1, kMaxFactor = 10.0;

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

}  // namespace specula

#include "engine/step_cost.h"

#include <algorithm>
#include <cmath>

namespace specula {
namespace {

constexpr int K = StepCost::kFeatures;
using Vector = std::array<double, K>;
using Matrix = std::array<Vector, K>;

constexpr double kForget = 0.99;         // per observation: a half-life of ~70 steps
constexpr double kPriorWidth = 0.5;      // a coefficient may move by about half of itself
constexpr double kObservationError = 0.1;  // relative error of one step's timing

// Solves m theta = b over the coefficients in `free` (the others are 0), by Gaussian elimination
// with partial pivoting. A singular direction gets 0.
Vector SolveFree(Matrix m, Vector b, const std::array<bool, K>& free) {
  std::array<int, K> idx{};
  int n = 0;
  for (int j = 0; j < K; ++j) {
    if (free[j]) idx[n++] = j;
  }
  double a[K][K + 1];
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < n; ++c) a[r][c] = m[idx[r]][idx[c]];
    a[r][n] = b[idx[r]];
  }
  for (int c = 0; c < n; ++c) {
    int p = c;
    for (int r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    }
    std::swap(a[c], a[p]);
    if (std::abs(a[c][c]) < 1e-300) continue;
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int cc = c; cc <= n; ++cc) a[r][cc] -= f * a[c][cc];
    }
  }
  Vector theta{};
  for (int r = 0; r < n; ++r) theta[idx[r]] = std::abs(a[r][r]) < 1e-300 ? 0.0 : a[r][n] / a[r][r];
  return theta;
}

// Minimizes over theta >= 0: fixes the most negative coefficient at zero and solves again.
Vector SolveNonNegative(const Matrix& m, const Vector& b) {
  std::array<bool, K> free;
  free.fill(true);
  for (;;) {
    Vector theta = SolveFree(m, b, free);
    int worst = -1;
    for (int j = 0; j < K; ++j) {
      if (free[j] && theta[j] < 0 && (worst < 0 || theta[j] < theta[worst])) worst = j;
    }
    if (worst < 0) return theta;
    free[worst] = false;
  }
}

}  // namespace

std::array<double, StepCost::kFeatures> NonNegativeLeastSquares(const std::vector<CostSample>& samples, double ridge) {
  Matrix m{};
  Vector b{};
  for (const CostSample& s : samples) {
    for (int i = 0; i < K; ++i) {
      for (int j = 0; j < K; ++j) m[i][j] += s.x[i] * s.x[j];
      b[i] += s.x[i] * s.seconds;
    }
  }
  for (int j = 0; j < K; ++j) m[j][j] += ridge * (1.0 + m[j][j]);
  return SolveNonNegative(m, b);
}

StepCost::StepCost(const std::vector<CostSample>& samples) {
  if (samples.empty()) return;
  prior_ = NonNegativeLeastSquares(samples, 1e-9);
  Vector typical{};  // the largest value of each feature in the samples
  scale_ = 0;
  for (const CostSample& s : samples) {
    scale_ += s.seconds / samples.size();
    for (int j = 0; j < K; ++j) typical[j] = std::max(typical[j], std::abs(s.x[j]));
  }
  for (int j = 0; j < K; ++j) {
    // A zero coefficient may still grow to a tenth of a typical step at the feature's typical value.
    const double width = kPriorWidth * std::max(prior_[j], 0.1 * scale_ / std::max(typical[j], 1e-3));
    precision_[j] = 1.0 / (width * width);
  }
  theta_ = prior_;
}

double StepCost::Predict(const CostFeatures& x) const {
  double t = 0;
  for (int j = 0; j < K; ++j) t += theta_[j] * x[j];
  return t;
}

void StepCost::Observe(const CostFeatures& x, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  const double err = kObservationError * std::max({Predict(x), seconds, 1e-6});
  const double w = 1.0 / (err * err);
  for (int i = 0; i < K; ++i) {
    for (int j = 0; j < K; ++j) xtx_[i][j] = kForget * xtx_[i][j] + w * x[i] * x[j];
    xty_[i] = kForget * xty_[i] + w * x[i] * seconds;
  }
  Solve();
}

void StepCost::Solve() {
  Matrix m = xtx_;
  Vector b = xty_;
  for (int j = 0; j < K; ++j) {
    // Without a prior (no startup samples) a weak pull to zero keeps the system solvable.
    const double p = precision_[j] > 0 ? precision_[j] : 1e-6 / (scale_ * scale_);
    m[j][j] += p;
    b[j] += p * prior_[j];
  }
  theta_ = SolveNonNegative(m, b);
}

}  // namespace specula

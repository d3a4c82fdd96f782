#include "engine/spec_controller.h"

#include <algorithm>
#include <cmath>

namespace specula {
namespace {

// Acceptance is Beta-distributed: engine-wide, Beta(1, 1) (uniform) plus the decayed counts of every
// verification; per request, the engine-wide mean worth kRequestWeight verifications plus the
// request's own counts.
constexpr double kEngineForget = 0.999;  // per verification, engine-wide
constexpr double kRequestWeight = 4.0;

// A draw from Beta(a, b), as X / (X + Y) for X ~ Gamma(a), Y ~ Gamma(b).
double SampleBeta(double a, double b, std::mt19937_64* rng) {
  const double x = std::gamma_distribution<double>(a, 1.0)(*rng);
  const double y = std::gamma_distribution<double>(b, 1.0)(*rng);
  return x + y > 0 ? x / (x + y) : 0.5;
}

// Sum of (p + 1) for positions p in [first, first + n).
double Positions(int64_t first, int64_t n) { return n <= 0 ? 0.0 : n * (first + 1) + 0.5 * n * (n - 1.0); }

}  // namespace

SpecController::SpecController(StepCost target_cost, std::unique_ptr<StepCost> draft_cost)
    : target_(std::move(target_cost)), draft_(std::move(draft_cost)) {}

double SpecController::EngineAlpha() const {
  return (engine_.accepted + 1.0) / (engine_.accepted + engine_.rejected + 2.0);
}

std::pair<double, double> SpecController::Posterior(RequestId id) const {
  const double prior = EngineAlpha();
  double a = kRequestWeight * prior, b = kRequestWeight * (1.0 - prior);
  if (auto it = seqs_.find(id); it != seqs_.end()) {
    a += it->second.accepted;
    b += it->second.rejected;
  }
  return {a, b};
}

double SpecController::Alpha(RequestId id) const {
  const auto [a, b] = Posterior(id);
  return a / (a + b);
}

void SpecController::ObserveAcceptance(RequestId id, int32_t drafts, int32_t accepted) {
  if (drafts <= 0) return;
  // Under the model (each draft accepted with probability alpha until the first rejection) the
  // likelihood of a verification is alpha^accepted (1 - alpha)^[accepted < drafts].
  const double rejected = accepted < drafts ? 1.0 : 0.0;
  Acceptance& a = seqs_[id];
  a.accepted += accepted;
  a.rejected += rejected;
  engine_.accepted = kEngineForget * engine_.accepted + accepted;
  engine_.rejected = kEngineForget * engine_.rejected + rejected;
}

void SpecController::ObserveStep(const CostFeatures& target_x, double target_seconds, const CostFeatures& draft_x,
                                 double draft_seconds) {
  target_.Observe(target_x, target_seconds);
  if (draft_ != nullptr && draft_x[0] > 0) draft_->Observe(draft_x, draft_seconds);
}

CostFeatures SpecController::TargetFeatures(CostFeatures x, absl::Span<const SpecCandidate> c,
                                            absl::Span<const int32_t> k) {
  for (size_t i = 0; i < c.size(); ++i) {
    x[1] += k[i];
    x[2] += k[i];
    x[3] += Positions(c[i].len, k[i]) / 1024.0;  // drafts at positions len .. len + k - 1
  }
  return x;
}

CostFeatures SpecController::DraftFeatures(absl::Span<const SpecCandidate> c, absl::Span<const int32_t> k) {
  CostFeatures x{};
  for (size_t i = 0; i < c.size(); ++i) {
    if (k[i] <= 0) continue;
    // k forwards: the first runs the tokens the draft lags by, each later one the previous draft.
    const int32_t fed = c[i].catch_up + k[i] - 1;
    x[0] = std::max<double>(x[0], k[i]);
    x[1] += fed;
    x[2] += k[i];
    x[3] += Positions(c[i].len - c[i].catch_up, fed) / 1024.0;
  }
  return x;
}

std::vector<int32_t> SpecController::Choose(const CostFeatures& base, double fixed_tokens,
                                            absl::Span<const SpecCandidate> c) {
  // Thompson sampling: the best choice for one draw from each request's posterior. A request known
  // well gets its mean; one with little evidence (a new request, or one whose first drafts were
  // rejected and that has not speculated since) sometimes draws high enough to try drafts again.
  std::vector<double> alpha(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    const auto [a, b] = Posterior(c[i].id);
    alpha[i] = std::min(SampleBeta(a, b, &rng_), 0.99);
  }
  return Select(base, fixed_tokens, c, alpha);
}

std::vector<int32_t> SpecController::Select(const CostFeatures& base, double fixed_tokens,
                                            absl::Span<const SpecCandidate> c, const std::vector<double>& alpha) const {
  const size_t n = c.size();
  // Every candidate draft (sequence i, its j-th draft) with the tokens it adds: alpha_i^j.
  struct Draft {
    double gain;
    size_t seq;
    int32_t j;
  };
  std::vector<Draft> drafts;
  int32_t max_k = 0;
  for (size_t i = 0; i < n; ++i) {
    double gain = 1.0;
    for (int32_t j = 1; j <= c[i].max_k; ++j) {
      gain *= alpha[i];
      if (gain < 1e-3) break;
      drafts.push_back({gain, i, j});
      max_k = std::max(max_k, j);
    }
  }
  std::stable_sort(drafts.begin(), drafts.end(), [](const Draft& a, const Draft& b) { return a.gain > b.gain; });

  std::vector<int32_t> best(n, 0), k(n);
  double best_goodput = (fixed_tokens + static_cast<double>(n)) / std::max(target_.Predict(base), 1e-9);
  // The draft runs as many forwards as the longest proposal, so drafts cost less once that many are
  // paid for: one walk per cap on the forwards, each adding drafts in order of gain, keeping the
  // prefix of largest goodput (the best set is a prefix for its cap).
  for (int32_t cap = 1; cap <= max_k; ++cap) {
    std::fill(k.begin(), k.end(), 0);
    CostFeatures tx = base, dx{};
    double tokens = fixed_tokens + static_cast<double>(n);
    for (const Draft& d : drafts) {
      if (d.j > cap) continue;
      const SpecCandidate& s = c[d.seq];
      const int32_t j = ++k[d.seq];  // == d.j: a sequence's drafts come in order of j
      tx[1] += 1;
      tx[2] += 1;
      tx[3] += (s.len + j) / 1024.0;
      if (j == 1) {
        dx[1] += s.catch_up;
        dx[3] += Positions(s.len - s.catch_up, s.catch_up) / 1024.0;
      } else {
        dx[1] += 1;
        dx[3] += (s.len + j - 1) / 1024.0;
      }
      dx[0] = std::max<double>(dx[0], j);
      dx[2] += 1;
      tokens += d.gain;
      const double seconds = target_.Predict(tx) + (draft_ != nullptr ? draft_->Predict(dx) : 0.0);
      const double goodput = tokens / std::max(seconds, 1e-9);
      if (goodput > best_goodput) {
        best_goodput = goodput;
        best = k;
      }
    }
  }
  return best;
}

}  // namespace specula

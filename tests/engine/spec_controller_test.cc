// Adaptive speculation's parts on their own: the step cost model (fit, non-negativity, tracking a
// machine that slows down, keeping its prior where steps never vary) and the controller (acceptance
// estimates, the choice of k in regimes where speculation pays and where it cannot, retrying a
// request after early rejections, the feature arithmetic).
#include "engine/spec_controller.h"

#include <random>

#include "engine/step_cost.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

constexpr std::array<double, 4> kTheta = {1e-3, 2e-5, 5e-5, 1e-4};  // seconds per forward, token, row, 1024 positions

CostSample Sample(const CostFeatures& x, const std::array<double, 4>& theta, double scale = 1.0) {
  double y = 0;
  for (int j = 0; j < 4; ++j) y += theta[j] * x[j];
  return {x, y * scale};
}

std::vector<CostSample> Grid(const std::array<double, 4>& theta) {
  return {Sample({1, 1, 1, 0.001}, theta), Sample({1, 9, 9, 0.04}, theta), Sample({1, 64, 1, 2.0}, theta),
          Sample({1, 8, 8, 0.01}, theta), Sample({1, 8, 8, 2.0}, theta)};
}

TEST(StepCostTest, FitsTheMeasuredSamples) {
  const StepCost cost(Grid(kTheta));
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(cost.coefficients()[j], kTheta[j], 1e-6 * kTheta[j]) << j;
  EXPECT_NEAR(cost.Predict({1, 32, 32, 5}), Sample({1, 32, 32, 5}, kTheta).seconds, 1e-9);
}

TEST(StepCostTest, CoefficientsStayNonNegative) {
  // Timings that a fit would explain with a negative per-row cost.
  std::vector<CostSample> s = {{{1, 1, 1, 0}, 1e-3}, {{1, 10, 10, 0}, 1.1e-3}, {{1, 10, 1, 0}, 1.5e-3}};
  const auto theta = NonNegativeLeastSquares(s, 1e-9);
  for (double t : theta) EXPECT_GE(t, 0.0);
  EXPECT_GT(theta[0] + theta[1], 0.0);
}

TEST(StepCostTest, FollowsAMachineThatSlowsDownAndKeepsUnvariedDirections) {
  StepCost cost(Grid(kTheta));
  std::mt19937 rng(1);
  // 400 decode steps of a batch between 1 and 32 at growing contexts, on a machine twice as slow:
  // tokens == rows in all of them, so their split is never observed.
  for (int i = 0; i < 400; ++i) {
    const double b = 1 + rng() % 32;
    const CostFeatures x = {1, b, b, b * (100 + i) / 1024.0};
    cost.Observe(x, Sample(x, kTheta, 2.0).seconds);
  }
  const CostFeatures decode = {1, 16, 16, 4};
  EXPECT_NEAR(cost.Predict(decode), Sample(decode, kTheta, 2.0).seconds, 0.05 * Sample(decode, kTheta, 2.0).seconds);
  // A prefill chunk (many tokens, one row) was never seen: the prediction stays between the old
  // machine's and twice it, instead of running off.
  const CostFeatures prefill = {1, 512, 1, 100};
  EXPECT_GT(cost.Predict(prefill), 0.8 * Sample(prefill, kTheta).seconds);
  EXPECT_LT(cost.Predict(prefill), 2.5 * Sample(prefill, kTheta).seconds);
}

// A controller whose target step costs `fixed` seconds plus `per_token` per new token, and whose draft
// costs `per_forward` per forward (0: no draft model).
SpecController Controller(double per_token, double per_forward, double fixed = 1e-3) {
  const std::array<double, 4> target = {fixed, per_token / 2, per_token / 2, 0};
  std::unique_ptr<StepCost> draft;
  if (per_forward > 0) draft = std::make_unique<StepCost>(Grid({per_forward, 1e-7, 1e-7, 0}));
  return SpecController(StepCost(Grid(target)), std::move(draft));
}

// `verifications` of k = 4 drafts, each accepted with probability alpha until the first rejection.
void Simulate(SpecController& c, RequestId id, double alpha, int verifications, std::mt19937* rng) {
  std::uniform_real_distribution<double> u(0, 1);
  for (int v = 0; v < verifications; ++v) {
    int accepted = 0;
    while (accepted < 4 && u(*rng) < alpha) ++accepted;
    c.ObserveAcceptance(id, 4, accepted);
  }
}

TEST(SpecControllerTest, EstimatesAcceptanceFromTruncatedRuns) {
  SpecController c = Controller(1e-5, 1e-4);
  std::mt19937 rng(2);
  Simulate(c, 1, 0.7, 3000, &rng);
  Simulate(c, 2, 0.3, 3000, &rng);
  EXPECT_NEAR(c.Alpha(1), 0.7, 0.02);  // accepted / draft tokens would say ~0.52
  EXPECT_NEAR(c.Alpha(2), 0.3, 0.02);
  EXPECT_GT(c.EngineAlpha(), 0.3);
  EXPECT_LT(c.EngineAlpha(), 0.7);
  EXPECT_NEAR(c.Alpha(99), c.EngineAlpha(), 1e-12);  // no observations: the engine's estimate
  c.Forget(1);
  EXPECT_NEAR(c.Alpha(1), c.EngineAlpha(), 1e-12);
}

TEST(SpecControllerTest, SpeculatesOnlyWhereItPays) {
  std::mt19937 rng(3);
  const CostFeatures base = {1, 8, 8, 0.5};  // 8 decoding sequences
  std::vector<SpecCandidate> c;
  for (int i = 0; i < 8; ++i) c.push_back({i, 8, 100, 1});
  // Memory-bound target (a token costs 1% of a step) and a draft forward of 5%: drafts pay.
  SpecController cheap = Controller(1e-5, 5e-5);
  for (int i = 0; i < 8; ++i) Simulate(cheap, i, 0.8, 2000, &rng);
  for (int32_t k : cheap.Choose(base, 0, c)) {
    EXPECT_GE(k, 2);
    EXPECT_LE(k, 8);
  }
  // Compute-bound target (the tokens are nearly all of a step): no drafts.
  SpecController busy = Controller(1e-3, 5e-5, 1e-4);
  for (int i = 0; i < 8; ++i) Simulate(busy, i, 0.8, 2000, &rng);
  for (int32_t k : busy.Choose(base, 0, c)) EXPECT_EQ(k, 0);
  // A draft forward as costly as a target step: no drafts.
  SpecController slow_draft = Controller(1e-5, 1e-3);
  for (int i = 0; i < 8; ++i) Simulate(slow_draft, i, 0.9, 2000, &rng);
  for (int32_t k : slow_draft.Choose(base, 0, c)) EXPECT_EQ(k, 0);
  // No draft model (n-gram): drafts cost only their verification.
  SpecController ngram = Controller(1e-5, 0);
  for (int i = 0; i < 8; ++i) Simulate(ngram, i, 0.8, 2000, &rng);
  for (int32_t k : ngram.Choose(base, 0, c)) EXPECT_GE(k, 4);
  // The scheduler's room bounds k.
  c[0].max_k = 1;
  EXPECT_EQ(cheap.Choose(base, 0, c)[0], 1);
}

// With a costly draft forward (0.4 ms on a 1 ms step), one draft for every sequence pays; no
// prefix of the order of gains is that set (the well-accepted sequences' second drafts come before
// the others' first), so the choice must weigh each number of forwards on its own.
TEST(SpecControllerTest, OneDraftEachWhenAForwardIsCostly) {
  SpecController c = Controller(1e-6, 4e-4);
  std::mt19937 rng(5);
  std::vector<SpecCandidate> cands;
  for (int i = 0; i < 20; ++i) {
    Simulate(c, i, i < 10 ? 0.8 : 0.3, 2000, &rng);
    cands.push_back({i, 8, 50, 1});
  }
  const std::vector<int32_t> k = c.Choose({1, 20, 20, 0.2}, 0, cands);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k[i], 1) << "sequence " << i;
}

TEST(SpecControllerTest, RetriesARequestWhoseFirstDraftsWereRejected) {
  // One sequence; a draft forward of 0.6 ms on a 1 ms step: a draft pays when alpha > 0.6.
  SpecController c = Controller(1e-5, 6e-4);
  std::mt19937 rng(4);
  Simulate(c, 1, 0.8, 500, &rng);  // other requests: the engine-wide estimate is 0.8
  c.ObserveAcceptance(2, 4, 0);    // request 2's first drafts: rejected
  c.ObserveAcceptance(2, 4, 0);
  // Its estimate (~0.53) says no; draws from its posterior say yes a third of the time.
  EXPECT_LT(c.Alpha(2), 0.6);
  int speculated = 0;
  for (int step = 0; step < 200; ++step) {
    speculated += c.Choose({1, 1, 1, 0.1}, 0, std::vector<SpecCandidate>{{2, 8, 100, 1}})[0] > 0;
  }
  EXPECT_GT(speculated, 20);  // not written off after two rejections
  EXPECT_LT(speculated, 180);
  // Request 1, well known at 0.8, always speculates.
  for (int step = 0; step < 50; ++step) EXPECT_GT(c.Choose({1, 1, 1, 0.1}, 0, std::vector<SpecCandidate>{{1, 8, 100, 1}})[0], 0);
}

TEST(SpecControllerTest, FeaturesOfADraftChoice) {
  const std::vector<SpecCandidate> c = {{1, 8, 100, 3}, {2, 8, 50, 1}, {3, 8, 10, 1}};
  const std::vector<int32_t> k = {2, 4, 0};
  const CostFeatures d = SpecController::DraftFeatures(c, k);
  EXPECT_EQ(d[0], 4);              // forwards: the longest proposal
  EXPECT_EQ(d[1], (3 + 1) + 4);    // tokens: lag + k - 1 each
  EXPECT_EQ(d[2], 2 + 4);          // rows: one per draft
  // Positions: sequence 1 runs positions 97..100, sequence 2 runs 49..52 (each + 1, / 1024).
  EXPECT_NEAR(d[3] * 1024, (98 + 99 + 100 + 101) + (50 + 51 + 52 + 53), 1e-9);
  const CostFeatures t = SpecController::TargetFeatures({1, 3, 3, 0}, c, k);
  EXPECT_EQ(t[1], 3 + 6);
  EXPECT_EQ(t[2], 3 + 6);
  EXPECT_NEAR(t[3] * 1024, (101 + 102) + (51 + 52 + 53 + 54), 1e-9);  // drafts at positions len, len + 1, ...
}

}  // namespace
}  // namespace specula

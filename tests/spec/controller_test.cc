// Adaptive speculation's parts on their own: the step cost table (interpolation, extrapolation,
// a factor that follows the machine, a correction by size) and the controller (acceptance
// estimates, the choice of k where speculation pays and where it cannot, a costly draft forward,
// retrying a request after early rejections, what each size of verification costs, the work of a
// choice).
#include "spec/controller.h"

#include <map>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "spec/step_cost.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

TEST(StepCostTest, InterpolatesAndExtendsTheMeasuredTable) {
  const StepCost cost({{4e6, 2e-3}, {1e6, 1e-3}, {8e6, 3e-3}, {4e6, 2.5e-3}});  // any order; the faster of equals
  EXPECT_DOUBLE_EQ(cost.Predict(1e6), 1e-3);
  EXPECT_DOUBLE_EQ(cost.Predict(2.5e6), 1.5e-3);
  EXPECT_DOUBLE_EQ(cost.Predict(4e6), 2e-3);
  EXPECT_DOUBLE_EQ(cost.Predict(6e6), 2.5e-3);
  EXPECT_DOUBLE_EQ(cost.Predict(16e6), 6e-3);  // past the table: in proportion to work (above the slope's 5e-3)
  EXPECT_DOUBLE_EQ(StepCost({{1e6, 1e-3}, {2e6, 3e-3}}).Predict(4e6), 7e-3);  // or the last segment's slope
  EXPECT_DOUBLE_EQ(cost.Predict(1e3), 1e-3);   // below it: the smallest forward's time
  EXPECT_EQ(StepCost().Predict(1e9), 0.0);
  // A noisy point below its predecessor is lifted: time never falls with work.
  EXPECT_DOUBLE_EQ(StepCost({{1e6, 2e-3}, {2e6, 1e-3}}).Predict(2e6), 2e-3);
}

TEST(StepCostTest, FollowsAMachineThatSlowsDown) {
  StepCost cost({{1e6, 1e-3}, {2e6, 2e-3}});
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> work(1e6, 2e6), noise(0.9, 1.1);
  for (int i = 0; i < 200; ++i) {  // twice as slow, 10% noise
    const double w = work(rng);
    cost.Observe(w, 2 * w * 1e-9 * noise(rng));
  }
  EXPECT_NEAR(cost.factor(), 2.0, 0.1);
  EXPECT_NEAR(cost.Predict(1.5e6), 3e-3, 0.15e-3);
  for (int i = 0; i < 10; ++i) cost.Observe(1.5e6, 1.0);  // a few 600x outliers move it by a factor, not 600
  EXPECT_LT(cost.factor(), 2.0 * 2.5);
}

// Each point learns the steps around it, in proportion to how near they are; a new table's points
// take the curve learned so far.
TEST(StepCostTest, WorkCorrectionLearnsEachSizeOnItsOwn) {
  WorkCorrection c;
  EXPECT_EQ(c.At(1e6), 1.0);  // no points: no correction
  c.SetWorks({8e6, 1e6, 2e6, 4e6});
  EXPECT_EQ(c.At(3e6), 1.0);
  // Steps of exactly 2e6 that run 1.5x their prediction, 1.5 / At: what a controller observes.
  for (int i = 0; i < 200; ++i) c.Observe(2e6, 1.5 / c.At(2e6));
  EXPECT_NEAR(c.At(2e6), 1.5, 0.01);
  EXPECT_NEAR(c.At(1e6), 1.0, 1e-12);  // the neighbours had no weight in those steps
  EXPECT_NEAR(c.At(4e6), 1.0, 1e-12);
  EXPECT_NEAR(c.At(2.828e6), std::sqrt(1.5), 0.01);  // halfway in logs
  // Steps between 4e6 and 8e6 that run 0.8x: both points learn, and the curve through them.
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> work(4e6, 8e6);
  for (int i = 0; i < 2000; ++i) {
    const double w = work(rng);
    c.Observe(w, 0.8 / c.At(w));
  }
  EXPECT_NEAR(c.At(5e6), 0.8, 0.03);
  EXPECT_NEAR(c.At(7e6), 0.8, 0.03);
  EXPECT_NEAR(c.At(2e6), 1.5, 0.01);
  // More points: the curve carries over.
  c.SetWorks({1e6, 2e6, 3e6, 4e6, 8e6, 16e6});
  EXPECT_NEAR(c.At(2e6), 1.5, 0.01);
  EXPECT_NEAR(c.At(16e6), c.At(8e6), 1e-12);  // flat past the last point
  // It corrects the shape, within [0.5, 2]: a machine 10x slower is its factor's to follow.
  for (int i = 0; i < 500; ++i) c.Observe(1e6, 10.0);
  EXPECT_NEAR(c.At(1e6), 2.0, 1e-9);
}

// A stories15m-shape target and a small draft of the same vocabulary.
ForwardShape Shape(int32_t dim, int32_t hidden, int32_t layers) {
  ForwardShape c;
  c.dim = c.q_dim = c.kv_dim = dim;  // 6 heads, as many for keys and values
  c.hidden_dim = hidden;
  c.num_layers = layers;
  c.num_heads = 6;
  c.head_dim = dim / 6;
  c.vocab_size = 32000;
  return c;
}
const ForwardShape kTarget = Shape(288, 768, 6), kDraft = Shape(66, 172, 2);

// A table of `fixed` seconds plus `per_token` per decode token (its logits row included) of `c`.
std::vector<CostPoint> Table(const ForwardShape& c, double fixed, double per_token) {
  std::vector<CostPoint> t;
  for (int n = 1; n <= 512; n *= 2) t.push_back({ForwardFlops(c, n, n, n * 50.0), fixed + per_token * n});
  return t;
}

// A controller whose target step costs `fixed` seconds plus `per_token` per new token, and whose draft
// forwards cost `per_forward` each (0: no draft model).
SpecController Controller(double per_token, double per_forward, double fixed = 1e-3) {
  std::unique_ptr<StepCost> draft;
  if (per_forward > 0) draft = std::make_unique<StepCost>(Table(kDraft, per_forward, 1e-7));
  return SpecController(kTarget, StepCost(Table(kTarget, fixed, per_token)), per_forward > 0 ? std::optional(kDraft) : std::nullopt,
                        std::move(draft));
}

// A controller with its requests' acceptance kept by id, as the engine's records keep them.
class TestController : public SpecController {
 public:
  using SpecController::SpecController;
  TestController(SpecController c) : SpecController(std::move(c)) {}  // NOLINT: from Controller()
  void ObserveAcceptance(RequestId id, int32_t drafts, int32_t accepted) {
    SpecController::ObserveAcceptance(&acceptance_[id], drafts, accepted);
  }
  double Alpha(RequestId id) { return SpecController::Alpha(acceptance_[id]); }
  void Forget(RequestId id) { acceptance_.erase(id); }
  std::vector<int32_t> Choose(double base_flops, double fixed_tokens, absl::Span<const SpecCandidate> c) {
    std::vector<SpecCandidate> with(c.begin(), c.end());
    for (SpecCandidate& x : with) x.acceptance = &acceptance_[x.id];
    return SpecController::Choose(base_flops, fixed_tokens, with);
  }

 private:
  std::map<RequestId, SpecAcceptance> acceptance_;
};

// The target's work for `n` decoding sequences at context 50.
double Base(int n) { return ForwardFlops(kTarget, n, n, n * 50.0); }

// Sequences 0 .. n - 1 at context 50, each with room for 8 drafts and one token to catch up on.
std::vector<SpecCandidate> Candidates(int n) {
  std::vector<SpecCandidate> c;
  for (int i = 0; i < n; ++i) c.push_back({i, 8, 50, 1});
  return c;
}

// `verifications` of k = 4 drafts, each accepted with probability alpha until the first rejection.
void Simulate(TestController& c, RequestId id, double alpha, int verifications, std::mt19937* rng) {
  std::uniform_real_distribution<double> u(0, 1);
  for (int v = 0; v < verifications; ++v) {
    int accepted = 0;
    while (accepted < 4 && u(*rng) < alpha) ++accepted;
    c.ObserveAcceptance(id, 4, accepted);
  }
}

TEST(SpecControllerTest, EstimatesAcceptanceFromTruncatedRuns) {
  TestController c = Controller(1e-5, 1e-4);
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
  std::vector<SpecCandidate> c = Candidates(8);
  // Memory-bound target (a token costs 1% of a step) and a draft forward of 5%: drafts pay.
  TestController cheap = Controller(1e-5, 5e-5);
  for (int i = 0; i < 8; ++i) Simulate(cheap, i, 0.8, 2000, &rng);
  for (int32_t k : cheap.Choose(Base(8), 0, c)) {
    EXPECT_GE(k, 2);
    EXPECT_LE(k, 8);
  }
  // Compute-bound target (the tokens are nearly all of a step): no drafts.
  TestController busy = Controller(1e-3, 5e-5, 1e-4);
  for (int i = 0; i < 8; ++i) Simulate(busy, i, 0.8, 2000, &rng);
  for (int32_t k : busy.Choose(Base(8), 0, c)) EXPECT_EQ(k, 0);
  // A draft forward as costly as a target step: no drafts.
  TestController slow_draft = Controller(1e-5, 1e-3);
  for (int i = 0; i < 8; ++i) Simulate(slow_draft, i, 0.9, 2000, &rng);
  for (int32_t k : slow_draft.Choose(Base(8), 0, c)) EXPECT_EQ(k, 0);
  // No draft model (n-gram): drafts cost only their verification.
  TestController ngram = Controller(1e-5, 0);
  for (int i = 0; i < 8; ++i) Simulate(ngram, i, 0.8, 2000, &rng);
  for (int32_t k : ngram.Choose(Base(8), 0, c)) EXPECT_GE(k, 4);
  // The scheduler's room bounds k.
  c[0].max_k = 1;
  EXPECT_EQ(cheap.Choose(Base(8), 0, c)[0], 1);
}

// Whether any acceptance could make drafts pay: not with a draft forward as costly as a target
// step, whatever the batch; yes with a cheap one, and always without a draft model.
TEST(SpecControllerTest, KnowsWhenNoAcceptanceMakesDraftsPay) {
  EXPECT_FALSE(Controller(1e-5, 1e-3).DraftsCouldPay(32, 8));
  EXPECT_FALSE(Controller(1e-5, 1e-3).DraftsCouldPay(1, 8));
  EXPECT_TRUE(Controller(1e-5, 5e-5).DraftsCouldPay(32, 8));
  EXPECT_TRUE(Controller(1e-5, 5e-5).DraftsCouldPay(1, 1));
  EXPECT_TRUE(Controller(1e-5, 0).DraftsCouldPay(32, 8));
  // A draft forward at 30% of a step pays at batch 1 with every draft accepted (0.3 ms a forward:
  // 5 tokens for 2.2 ms against 1 for 1 ms), though a batch of 8 that is compute-bound would not.
  EXPECT_TRUE(Controller(1e-5, 3e-4).DraftsCouldPay(8, 8));
  EXPECT_FALSE(Controller(1e-3, 3e-4, 1e-4).DraftsCouldPay(8, 8));
}

// One step of a controller of 8 sequences against a machine whose target and draft take `slow`
// times their tables' times (Controller(1e-5, 5e-5)'s), a step with drafts `extra` times more for
// the target part. Returns whether the step verified drafts.
bool RunStep(TestController& ctl, double slow, double extra) {
  static const StepCost target(Table(kTarget, 1e-3, 1e-5)), draft(Table(kDraft, 5e-5, 1e-7));
  const std::vector<SpecCandidate> c = Candidates(8);
  const std::vector<int32_t> k = ctl.Choose(Base(8), 0, c);
  const bool verified = std::any_of(k.begin(), k.end(), [](int32_t x) { return x > 0; });
  const double flops = ctl.TargetFlops(Base(8), c, k);
  const std::vector<double> forwards = ctl.DraftFlops(c, k);
  double draft_seconds = 0;
  for (double f : forwards) draft_seconds += f > 0 ? slow * draft.Predict(f) : 0.0;
  ctl.ObserveStep(flops, slow * target.Predict(flops) * (verified ? extra : 1.0), forwards, draft_seconds, verified);
  return verified;
}

// Steps that verify drafts do host work per logits row that the forward's table does not have.
// Measured 4x dearer than predicted while plain steps run as predicted, they stop being chosen, and
// plain steps keep their price.
TEST(SpecControllerTest, PricesStepsWithDraftsOnTheirOwn) {
  std::mt19937 rng(4);
  TestController ctl = Controller(1e-5, 5e-5);
  for (int i = 0; i < 8; ++i) Simulate(ctl, i, 0.8, 2000, &rng);
  const double plain = ctl.target_cost().Predict(Base(8));
  ASSERT_TRUE(RunStep(ctl, 1.0, 4.0));  // as predicted, drafts pay
  for (int s = 0; s < 300; ++s) RunStep(ctl, 1.0, 4.0);
  int verified = 0;
  for (int s = 0; s < 100; ++s) verified += RunStep(ctl, 1.0, 4.0);
  EXPECT_LE(verified, 5);
  EXPECT_NEAR(ctl.target_cost().Predict(Base(8)), plain, 0.02 * plain);
}

// Steps with drafts whose time grows faster with their size than the table's: (tokens / 16)^0.3
// times it, as a batch of 8 ran the stories15m shape (verifying 1 draft each 17% dearer than the
// table against 4 each 13% cheaper, relative to 2 each). A factor on every size cannot learn that:
// the table says two drafts each do best (where one does, and two run at 0.92x of its goodput).
// Requests of 40 steps each, new ones drawing their acceptance around the engine's, so that the
// sizes of the steps vary as they do in an engine.
TEST(SpecControllerTest, LearnsWhatEachSizeOfVerificationCosts) {
  TestController ctl = Controller(5e-5, 3e-4);  // 1 ms + 0.05 ms per token; draft forwards of 0.3 ms
  const StepCost table(Table(kTarget, 1e-3, 5e-5)), draft(Table(kDraft, 3e-4, 1e-7));
  std::mt19937 rng(12);
  for (int i = 0; i < 8; ++i) Simulate(ctl, 1000 + i, 0.8, 200, &rng);  // the engine's estimate: 0.8
  std::vector<SpecCandidate> c = Candidates(8);
  std::uniform_real_distribution<double> u(0, 1);
  auto step = [&](int s) {  // the mean drafts per sequence of step s, run on the machine above
    if (s % 5 == 0) {  // one of the 8 requests ends every 5 steps
      const int slot = (s / 5) % 8;
      ctl.Forget(c[slot].id);
      c[slot].id += 8;
    }
    const std::vector<int32_t> k = ctl.Choose(Base(8), 0, c);
    const int32_t drafts = std::accumulate(k.begin(), k.end(), 0);
    const double flops = ctl.TargetFlops(Base(8), c, k);
    const std::vector<double> forwards = ctl.DraftFlops(c, k);
    double draft_seconds = 0;
    for (double f : forwards) draft_seconds += draft.Predict(f);
    const double target = table.Predict(flops) * (drafts > 0 ? std::pow((8 + drafts) / 16.0, 0.3) : 1.0);
    ctl.ObserveStep(flops, target, forwards, draft_seconds, drafts > 0);
    for (int i = 0; i < 8; ++i) {
      int accepted = 0;
      while (accepted < k[i] && u(rng) < 0.8) ++accepted;
      ctl.ObserveAcceptance(c[i].id, k[i], accepted);
    }
    return drafts / 8.0;
  };
  double first = 0;
  for (int s = 0; s < 20; ++s) first += step(s) / 20;
  EXPECT_GE(first, 1.5);  // the table's choice
  for (int s = 20; s < 400; ++s) step(s);
  double mean_k = 0;
  for (int s = 400; s < 500; ++s) mean_k += step(s) / 100;
  std::printf("[controller] drafts per sequence: %.2f in the first 20 steps, %.2f after 400\n", first, mean_k);
  EXPECT_GT(mean_k, 0.7);
  EXPECT_LT(mean_k, 1.3);
}

// A machine 2.5 times slower for a spell (another process on the cores) while every step verifies,
// then back to its speed. Only steps with drafts teach their extra price over a plain step, so the
// spell goes there and the controller turns to plain steps, which never teach it back; it must
// still come back to drafts once the spell is over (through its draws of acceptance: the turn
// happens at the margin, and the steps with drafts that the draws choose bring the extra down).
TEST(SpecControllerTest, ComesBackToDraftsAfterASlowSpell) {
  std::mt19937 rng(8);
  TestController ctl = Controller(1e-5, 5e-5);
  for (int i = 0; i < 8; ++i) Simulate(ctl, i, 0.8, 2000, &rng);
  constexpr double kExtra = 1.2;  // steps with drafts: 20% of host work on top of the forward
  int verified = 0;
  for (int s = 0; s < 200; ++s) verified += RunStep(ctl, 1.0, kExtra);
  EXPECT_GT(verified, 190);
  int spell = 0;  // until the controller turns to plain steps
  while (spell < 200 && RunStep(ctl, 2.5, kExtra)) ++spell;
  EXPECT_LT(spell, 200);
  for (int s = 0; s < 200; ++s) RunStep(ctl, 1.0, kExtra);  // settling
  verified = 0;
  for (int s = 0; s < 100; ++s) verified += RunStep(ctl, 1.0, kExtra);
  EXPECT_GT(verified, 90);
}

// The turn from reading weights to arithmetic: one token costs as much as 8 (2 ms), past 8 each
// costs 0.25 ms. With 8 sequences, verifying one draft each doubles the step; with 2 it is nearly
// free. A line through the 16-token steps alone would call 8 tokens 60% dearer than they are.
TEST(SpecControllerTest, FollowsTheTurnFromMemoryToCompute) {
  std::vector<CostPoint> table;
  for (int n = 1; n <= 512; n *= 2) table.push_back({ForwardFlops(kTarget, n, n, n * 50.0), 2e-3 + 2.5e-4 * std::max(0, n - 8)});
  TestController c(kTarget, StepCost(table), kDraft, std::make_unique<StepCost>(Table(kDraft, 3e-4, 1e-7)));
  std::mt19937 rng(6);
  for (int i = 0; i < 8; ++i) Simulate(c, i, 0.8, 2000, &rng);
  const std::vector<SpecCandidate> eight = Candidates(8), two = Candidates(2);
  for (int32_t k : c.Choose(Base(8), 0, eight)) EXPECT_EQ(k, 0);
  for (int32_t k : c.Choose(Base(2), 0, two)) EXPECT_GE(k, 2);
}

// With a costly draft forward (0.4 ms on a 1 ms step), one draft for every sequence pays; no
// prefix of the order of gains is that set (the well-accepted sequences' second drafts come before
// the others' first), so the choice must weigh each number of forwards on its own.
TEST(SpecControllerTest, OneDraftEachWhenAForwardIsCostly) {
  TestController c = Controller(1e-6, 4e-4);
  std::mt19937 rng(5);
  for (int i = 0; i < 20; ++i) Simulate(c, i, i < 10 ? 0.8 : 0.3, 2000, &rng);
  const std::vector<SpecCandidate> cands = Candidates(20);
  const std::vector<int32_t> k = c.Choose(Base(20), 0, cands);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k[i], 1) << "sequence " << i;
}

TEST(SpecControllerTest, RetriesARequestWhoseFirstDraftsWereRejected) {
  // One sequence; a draft forward of 0.6 ms on a 1 ms step: a draft pays when alpha > 0.6.
  TestController c = Controller(1e-5, 6e-4);
  std::mt19937 rng(4);
  Simulate(c, 1, 0.8, 500, &rng);  // other requests: the engine-wide estimate is 0.8
  c.ObserveAcceptance(2, 4, 0);    // request 2's first drafts: rejected
  c.ObserveAcceptance(2, 4, 0);
  c.ObserveAcceptance(2, 4, 0);
  // Its estimate (~0.58) says no; draws from its posterior say yes about half of the time.
  EXPECT_LT(c.Alpha(2), 0.6);
  int speculated = 0;
  for (int step = 0; step < 200; ++step) {
    speculated += c.Choose(Base(1), 0, std::vector<SpecCandidate>{{2, 8, 50, 1}})[0] > 0;
  }
  EXPECT_GT(speculated, 20);  // not written off after two rejections
  EXPECT_LT(speculated, 180);
  // Request 1, well known at 0.8, always speculates.
  for (int step = 0; step < 50; ++step) EXPECT_GT(c.Choose(Base(1), 0, std::vector<SpecCandidate>{{1, 8, 50, 1}})[0], 0);
}

// Tables measured only up to 8-token forwards (the engine's startup shapes at batch 1 and 2): drafts
// that pay are chosen where the target's step stays within twice that, never past it, and every
// shape once measured.
TEST(SpecControllerTest, StaysWithinTheMeasuredShapes) {
  auto upto = [](std::vector<CostPoint> t, size_t points) { return std::vector<CostPoint>(t.begin(), t.begin() + points); };
  const std::vector<CostPoint> target = Table(kTarget, 1e-3, 1e-5), draft = Table(kDraft, 5e-5, 1e-7);
  TestController c(kTarget, StepCost(upto(target, 4)), kDraft, std::make_unique<StepCost>(upto(draft, 4)));
  std::mt19937 rng(7);
  for (int i = 0; i < 32; ++i) Simulate(c, i, 0.8, 2000, &rng);
  const std::vector<SpecCandidate> many = Candidates(32), one = Candidates(1);
  const double reach = 2 * target[3].flops;
  EXPECT_GE(c.Choose(Base(1), 0, one)[0], 2);  // 1 + k tokens: within reach
  std::vector<int32_t> k = c.Choose(Base(4), 0, absl::MakeConstSpan(many).subspan(0, 4));
  EXPECT_LE(c.TargetFlops(Base(4), absl::MakeConstSpan(many).subspan(0, 4), k), reach);
  EXPECT_GT(k[0] + k[1] + k[2] + k[3], 0);
  for (int32_t ki : c.Choose(Base(32), 0, many)) EXPECT_EQ(ki, 0);  // 32 tokens: past reach
  // A step past reach does not teach the factor (the table's extension would).
  c.ObserveStep(Base(32), 1.0, {}, 0);
  EXPECT_EQ(c.target_cost().factor(), 1.0);
  // Every shape measured: memory-bound steps of 32 take drafts.
  c.SetTargetPoints(target);
  c.SetDraftPoints(draft);
  k = c.Choose(Base(32), 0, many);
  EXPECT_GT(std::accumulate(k.begin(), k.end(), 0), 32);
}

// A batch of 8 with forwards of up to 8 tokens measured: one draft each (16 tokens) is priced in
// proportion to work past the table, and no draft is chosen; the table's last segment says such a
// step might pay, so the controller asks for the next shape. Measured, drafts are chosen. With
// drafts that are always rejected, or a draft forward as costly as the target's step, it never asks.
TEST(SpecControllerTest, AsksForLargerShapesWhereTheyMightPay) {
  const std::vector<CostPoint> target = Table(kTarget, 1e-3, 1e-5), draft = Table(kDraft, 5e-5, 1e-7);
  const std::vector<CostPoint> upto8(target.begin(), target.begin() + 4);
  const std::vector<SpecCandidate> eight = Candidates(8);
  auto all_zero = [](const std::vector<int32_t>& k) { return std::all_of(k.begin(), k.end(), [](int32_t x) { return x == 0; }); };
  for (const auto& [alpha, per_forward] : {std::pair{0.8, 5e-5}, std::pair{0.02, 5e-5}, std::pair{0.8, 2e-3}}) {
    TestController c(kTarget, StepCost(upto8), kDraft, std::make_unique<StepCost>(Table(kDraft, per_forward, 1e-7)));
    std::mt19937 rng(11);
    for (int i = 0; i < 8; ++i) Simulate(c, i, alpha, 2000, &rng);
    for (int step = 0; step < 20; ++step) EXPECT_TRUE(all_zero(c.Choose(Base(8), 0, eight))) << alpha;
    const bool pays = alpha > 0.5 && per_forward < 1e-3;
    EXPECT_EQ(c.wants_larger_shapes(), pays) << "alpha " << alpha << ", draft forward " << per_forward;
    if (!pays) continue;
    c.SetTargetPoints(target);
    EXPECT_FALSE(c.wants_larger_shapes());
    EXPECT_FALSE(all_zero(c.Choose(Base(8), 0, eight)));
  }
}

// Sequences whose draft lags 40 tokens behind (40 steps without drafts), with the draft measured up
// to 8-token forwards: the catch-up forward (320 tokens, its work 2.8x the largest measured) is
// priced past the table, and drafts that pay are still chosen. (Bounded to twice the table, such a
// lag kept auto on plain steps until new requests came.)
TEST(SpecControllerTest, TakesDraftsAfterALongLag) {
  const std::vector<CostPoint> draft = Table(kDraft, 5e-5, 1e-7);
  TestController c(kTarget, StepCost(Table(kTarget, 1e-3, 1e-5)), kDraft,
                   std::make_unique<StepCost>(std::vector<CostPoint>(draft.begin(), draft.begin() + 4)));
  std::mt19937 rng(9);
  for (int i = 0; i < 8; ++i) Simulate(c, i, 0.8, 2000, &rng);
  std::vector<SpecCandidate> lagging = Candidates(8);
  for (SpecCandidate& s : lagging) s.catch_up = 40;
  ASSERT_GT(c.DraftFlops(lagging, std::vector<int32_t>(8, 1))[0], 2.5 * draft[3].flops);
  for (int32_t k : c.Choose(Base(8), 0, lagging)) EXPECT_GE(k, 1);
}

TEST(SpecControllerTest, WorkOfADraftChoice) {
  TestController c = Controller(1e-5, 1e-4);
  const std::vector<SpecCandidate> cands = {{1, 8, 100, 3}, {2, 8, 50, 1}, {3, 8, 10, 1}};
  const std::vector<int32_t> k = {2, 4, 0};
  // The draft's forwards: the first runs each sequence's lag (3 tokens at 97..99, 1 at 49), each
  // later one a draft per sequence still proposing.
  const std::vector<double> d = c.DraftFlops(cands, k);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_DOUBLE_EQ(d[0], ForwardFlops(kDraft, 3, 1, 98 + 99 + 100) + ForwardFlops(kDraft, 1, 1, 50));
  EXPECT_DOUBLE_EQ(d[1], ForwardFlops(kDraft, 1, 1, 101) + ForwardFlops(kDraft, 1, 1, 51));
  EXPECT_DOUBLE_EQ(d[3], ForwardFlops(kDraft, 1, 1, 53));
  // The target's step: each draft one more token, with its row, at positions len, len + 1, ...
  EXPECT_DOUBLE_EQ(c.TargetFlops(1e6, cands, k),
                   1e6 + ForwardFlops(kTarget, 2, 2, 101 + 102) + ForwardFlops(kTarget, 4, 4, 51 + 52 + 53 + 54));
}

}  // namespace
}  // namespace specula

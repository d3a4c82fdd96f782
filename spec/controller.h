// Adaptive speculation (--num-spec-tokens auto): before each step, the number of draft tokens k_i of
// every decoding sequence, 0 included, chosen to maximize the step's expected goodput
//
//   G = (tokens the step yields anyway + sum_i E_i(k_i)) / (T_target + T_draft),
//   E_i(k) = (1 - alpha_i^(k+1)) / (1 - alpha_i),
//
// the expected tokens a verification of k drafts yields when each draft is accepted with
// probability alpha_i. alpha_i has a Beta posterior per request (its prior the engine-wide
// estimate), and each step uses one draw from it (Thompson sampling), so that a request whose
// estimate is poor still tries drafts now and then instead of never learning otherwise. The
// engine-wide estimate is itself drawn, once per step. T_target is the target's step and T_draft
// the sum of the draft's forwards (as many as the longest proposal), each from a StepCost table of
// time by work.
//
// The j-th draft of sequence i adds alpha_i^j expected tokens, so for a given number of draft
// forwards the best allocation adds drafts in decreasing order of alpha_i^j: for each such cap the
// controller walks that order and keeps the prefix of largest G, every prefix evaluated exactly
// (so the draft's cost of catching up on tokens it skipped is counted where it falls).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "core/step.h"
#include "core/forward_work.h"
#include "spec/step_cost.h"

namespace specula {

// A request's acceptance so far, held in its record (the controller keeps no state per request):
// drafts accepted, and verifications that rejected one.
struct SpecAcceptance {
  double accepted = 0, rejected = 0;
};

// One decoding sequence of the step.
struct SpecCandidate {
  RequestId id = 0;
  int32_t max_k = 0;     // drafts the scheduler made room for
  int32_t len = 0;       // tokens so far (the last one not yet run through the target)
  int32_t catch_up = 0;  // tokens the draft model must run before its first draft (its lag)
  size_t plan_index = 0;  // its place in the step's plan
  SpecAcceptance* acceptance = nullptr;  // its request's (null: none kept), updated by the step's verification
};

class SpecController {
 public:
  // `draft` and `draft_cost` are empty for proposers without a model (n-gram: no draft time).
  SpecController(const ForwardShape& target, StepCost target_cost, std::optional<ForwardShape> draft,
                 std::unique_ptr<StepCost> draft_cost);

  // `base_flops`: the step's target work without any draft; `fixed_tokens`: tokens the step yields
  // besides the candidates' (prefills that end this step). Returns k per candidate.
  std::vector<int32_t> Choose(double base_flops, double fixed_tokens, absl::Span<const SpecCandidate> c);

  // The target's work for `k[i]` drafts on top of `base_flops`, and the draft's forwards' work
  // ([longest proposal]; empty without a draft model).
  double TargetFlops(double base_flops, absl::Span<const SpecCandidate> c, absl::Span<const int32_t> k) const;
  std::vector<double> DraftFlops(absl::Span<const SpecCandidate> c, absl::Span<const int32_t> k) const;

  // A verification of `drafts` draft tokens of which the first `accepted` were accepted, into the
  // request's record `a` and the engine-wide estimate.
  void ObserveAcceptance(SpecAcceptance* a, int32_t drafts, int32_t accepted);
  // A step's measured times: the target part (everything but drafting) and the draft's forwards.
  // `verified`: some sequence of the step had drafts. Such steps learn a factor of their own on
  // top of the plain steps' one: their host work per logits row (a distribution over the
  // vocabulary to verify against, where a plain step takes an argmax) is not in the forward's
  // table, and a factor learned mostly from plain steps priced them too low (auto speculated on
  // 30% of the steps of a batch of 8 where every fixed k lost, for 0.86x of no speculation).
  void ObserveStep(double target_flops, double target_seconds, absl::Span<const double> draft_flops,
                   double draft_seconds, bool verified = false);

  // Tables with more shapes measured (spec/adaptive.h measures the larger ones lazily); each keeps
  // its factor. The draft's is ignored without a draft model.
  void SetTargetPoints(std::vector<CostPoint> points) {
    target_cost_.SetPoints(std::move(points));
    SetShapeWorks();
    wants_larger_shapes_ = false;
  }
  // True once a step could have gained from drafts that put it past the target's measured shapes,
  // priced by the table's last segment (PredictLine; the choices price them in proportion to work
  // there, which no draft beats). The engine then measures the next shape at once instead of within
  // its share of the steps' time: at batch 8 that share took ~60 s of steps to allow 16 tokens, and
  // auto ran plain steps where one or two drafts each gained 1.1-1.2x.
  bool wants_larger_shapes() const { return wants_larger_shapes_; }
  void SetDraftPoints(std::vector<CostPoint> points) {
    if (draft_cost_ != nullptr) draft_cost_->SetPoints(std::move(points));
  }

  // Whether drafts could pay were every one of them accepted: batches of 1, 2, 4, ... up to
  // `max_seqs` sequences at a short context, each with room for `max_k` drafts, priced by the tables
  // as the choices price them (the margin included), as far as the target's table reaches. False: no
  // acceptance makes a step with drafts beat the plain one at any measured size; where steps past
  // those might (priced by the table's last segment), wants_larger_shapes() is set and the engine
  // measures the next shape and asks again. Otherwise larger batches gain less from drafts still
  // (the target's step grows with its tokens there, the draft's forwards too), and the engine
  // leaves speculation off without asking again: the tinystories pair's draft costs about as
  // much as its target, and choosing 0 on every step, with the cost model's later shapes measured as if drafts
  // might pay, cost auto ~1% of a 0.3 s CLI job.
  bool DraftsCouldPay(int32_t max_seqs, int32_t max_k) const;

  // The acceptance estimate (posterior mean) of a request, and the engine-wide one.
  double Alpha(const SpecAcceptance& r) const;
  double EngineAlpha() const;
  const StepCost& target_cost() const { return target_cost_; }
  const StepCost* draft_cost() const { return draft_cost_.get(); }

 private:
  // A candidate draft of Select: sequence seq's j-th, the tokens it adds (alpha^j), and the work it
  // adds to the target's step and to the draft's j-th forward.
  struct Draft {
    double gain;
    size_t seq;
    int32_t j;
    double target_flops, draft_flops;
  };
  // The candidate drafts (sequence i, its j-th draft) in order of the tokens they add, alpha_i^j,
  // ties by (sequence, j), each with the work it adds to the target's step and to the draft's j-th
  // forward. A sequence's gains fall with j, so the order merges the sequences' runs: it is made
  // lazily from a heap of each sequence's next draft, as far as Select's walks read it (they mostly
  // stop after a few drafts; sorting all 256 drafts of 32 sequences was most of the controller's
  // time in steps that speculate on nothing). drafts_ is the order so far; heap_ the next drafts.
  mutable std::vector<Draft> drafts_, heap_;
  void PushDraft(size_t i, int32_t j, double gain, absl::Span<const SpecCandidate> c) const;
  // drafts_[idx], extending the order; null past the last draft.
  const Draft* NextDraft(size_t idx, absl::Span<const SpecCandidate> c, const std::vector<double>& alpha) const;
  // The gains of every j-th draft summed over the candidates ([max j + 1]), and the draft's cheapest
  // first forward, for Select's bounds; starts the order with each candidate's first draft.
  std::vector<double> LevelGains(absl::Span<const SpecCandidate> c, const std::vector<double>& alpha,
                                 double* first_forward) const;
  mutable bool wants_larger_shapes_ = false;  // set by Select
  // Choose without the skipping of long plain runs.
  std::vector<int32_t> Evaluate(double base_flops, double fixed_tokens, absl::Span<const SpecCandidate> c);
  int32_t off_run_ = 0;  // plain choices in a row (up to tuning::kOffRun), then counts the steps past them
  // The best k per candidate for acceptances `alpha` (per candidate).
  std::vector<int32_t> Select(double base_flops, double fixed_tokens, absl::Span<const SpecCandidate> c,
                              const std::vector<double>& alpha) const;
  // The draft's first forward for a candidate's first draft (its catch-up); 0 without a draft model.
  double FirstDraftFlops(const SpecCandidate& c) const;
  // The draft's time for forwards of work `flops`.
  double DraftSeconds(absl::Span<const double> flops) const;

  // Beta(a, b) of a request's acceptance (null: nothing observed), around the engine-wide `prior`
  // (< 0: its mean).
  std::pair<double, double> Posterior(const SpecAcceptance* r, double prior = -1) const;

  ForwardShape target_;
  StepCost target_cost_;   // plain steps
  StepCost verify_extra_;  // no table: its factor() is what steps with drafts take beyond target_cost_
  WorkCorrection verify_shape_;  // and by their size, at target_cost_'s points and between them
  void SetShapeWorks();          // verify_shape_'s points from target_cost_'s
  // The target part of a step with drafts of `flops` work.
  double VerifiedSeconds(double flops) const {
    return target_cost_.Predict(flops) * verify_extra_.factor() * verify_shape_.At(flops);
  }
  std::optional<ForwardShape> draft_;
  std::unique_ptr<StepCost> draft_cost_;
  SpecAcceptance engine_;  // decayed sums over every request
  std::mt19937_64 rng_{0x5eed};
};

}  // namespace specula

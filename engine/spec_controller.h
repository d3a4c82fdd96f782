// Adaptive speculation (--num-spec-tokens auto): before each step, the number of draft tokens k_i of
// every decoding sequence, 0 included, chosen to maximize the step's expected goodput
//
//   G = (tokens the step yields anyway + sum_i E_i(k_i)) / (T_target + T_draft),
//   E_i(k) = (1 - alpha_i^(k+1)) / (1 - alpha_i),
//
// the expected tokens a verification of k drafts yields when each draft is accepted with
// probability alpha_i. alpha_i has a Beta posterior per request (its prior the engine-wide
// estimate), and each step uses one draw from it (Thompson sampling), so that a request whose
// estimate is poor still tries drafts now and then instead of never learning otherwise. The step
// times come from StepCost models of the target's step and of the draft's forwards.
//
// The j-th draft of sequence i adds alpha_i^j expected tokens, so for a given number of draft
// forwards (the longest proposal) the best allocation adds drafts in decreasing order of alpha_i^j:
// for each such cap the controller walks that order and keeps the prefix of largest G, every
// prefix evaluated exactly (so the draft's cost of catching up on tokens it skipped is counted
// where it falls).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"
#include "core/step.h"
#include "engine/step_cost.h"

namespace specula {

// One decoding sequence of the step.
struct SpecCandidate {
  RequestId id = 0;
  int32_t max_k = 0;     // drafts the scheduler made room for
  int32_t len = 0;       // tokens so far (the last one not yet run through the target)
  int32_t catch_up = 0;  // tokens the draft model must run before its first draft (its lag)
};

class SpecController {
 public:
  // `draft_cost` is null for proposers without a model (n-gram: no draft time).
  SpecController(StepCost target_cost, std::unique_ptr<StepCost> draft_cost);

  // `base`: the step's target features without any draft; `fixed_tokens`: tokens the step yields
  // besides the candidates' (prefills that end this step). Returns k per candidate.
  std::vector<int32_t> Choose(const CostFeatures& base, double fixed_tokens, absl::Span<const SpecCandidate> c);

  // Target features of `k[i]` drafts on top of `base`, and the draft's features for them.
  static CostFeatures TargetFeatures(CostFeatures base, absl::Span<const SpecCandidate> c, absl::Span<const int32_t> k);
  static CostFeatures DraftFeatures(absl::Span<const SpecCandidate> c, absl::Span<const int32_t> k);

  // A verification of `drafts` draft tokens of which the first `accepted` were accepted.
  void ObserveAcceptance(RequestId id, int32_t drafts, int32_t accepted);
  void Forget(RequestId id) { seqs_.erase(id); }
  // A step's measured times: the target part (everything but drafting) and the draft part.
  void ObserveStep(const CostFeatures& target_x, double target_seconds, const CostFeatures& draft_x,
                   double draft_seconds);

  // The acceptance estimate (posterior mean) of a request, and the engine-wide one.
  double Alpha(RequestId id) const;
  double EngineAlpha() const;
  const StepCost& target_cost() const { return target_; }
  const StepCost* draft_cost() const { return draft_.get(); }

 private:
  // The best k per candidate for acceptances `alpha` (per candidate).
  std::vector<int32_t> Select(const CostFeatures& base, double fixed_tokens, absl::Span<const SpecCandidate> c,
                              const std::vector<double>& alpha) const;

  struct Acceptance {
    double accepted = 0, rejected = 0;  // drafts accepted; verifications that rejected one
  };
  // Beta(a, b) of a request's acceptance.
  std::pair<double, double> Posterior(RequestId id) const;

  StepCost target_;
  std::unique_ptr<StepCost> draft_;
  std::unordered_map<RequestId, Acceptance> seqs_;
  Acceptance engine_;  // decayed sums over every request
  std::mt19937_64 rng_{0x5eed};
};

}  // namespace specula

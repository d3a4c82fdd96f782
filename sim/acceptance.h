// How many of a verification's drafts the simulated target accepts. The engine's acceptance comes
// from the models; the simulator's from a distribution measured by an experiment (per position,
// for one proposer and workload) or a fixed alpha for what-ifs, with each request drawing its own
// level around it, since acceptance varies far more between requests than between steps.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "core/step.h"

namespace specula {

class AcceptanceModel {
 public:
  virtual ~AcceptanceModel() = default;
  // The drafts a proposer gives when asked for k by request `id` after `generated` output tokens
  // (an n-gram or suffix lookup can find fewer, or none).
  virtual int32_t Proposed(RequestId id, int32_t k, int32_t generated, std::mt19937_64& rng) { return k; }
  // The drafts accepted (0..k) when request `id` verifies k drafts after `generated` output tokens.
  virtual int32_t Accepted(RequestId id, int32_t k, int32_t generated, std::mt19937_64& rng) = 0;
  virtual void Forget(RequestId id) {}
  // The same model with no request state: each simulation starts from one.
  virtual std::unique_ptr<AcceptanceModel> Fresh() const = 0;
};

// Draft j (0-based) is accepted, given drafts 0..j-1 were, with probability conditional[j] (the
// last entry repeats) times the request's level: each request draws u from Beta(c m, c (1 - m))
// once, m the mean of `conditional`, and scales every conditional by u / m (capped at 1). c is the
// spread's concentration (larger: requests closer alike); 0 means no per-request variation.
class PositionalAcceptance final : public AcceptanceModel {
 public:
  // Errors: empty, or a probability outside [0, 1]; spread_c < 0.
  static absl::StatusOr<PositionalAcceptance> Create(std::vector<double> conditional, double spread_c = 0);
  // Conditional probabilities from an experiment's acceptance_per_position (the share of
  // verifications whose draft j was accepted; runs with a fixed k): p_j / p_{j-1}.
  static absl::StatusOr<PositionalAcceptance> FromPerPosition(const std::vector<double>& per_position, double spread_c = 0);

  int32_t Accepted(RequestId id, int32_t k, int32_t generated, std::mt19937_64& rng) override;
  // A proposer without a model finds drafts with probability `rate` (1: always, as a draft model).
  void set_proposal_rate(double rate) { proposal_rate_ = rate; }
  int32_t Proposed(RequestId id, int32_t k, int32_t generated, std::mt19937_64& rng) override {
    return proposal_rate_ >= 1 || std::uniform_real_distribution<double>(0.0, 1.0)(rng) < proposal_rate_ ? k : 0;
  }
  void Forget(RequestId id) override { level_.erase(id); }
  std::unique_ptr<AcceptanceModel> Fresh() const override {
    auto a = std::make_unique<PositionalAcceptance>(*this);
    a->level_.clear();
    return a;
  }
  const std::vector<double>& conditional() const { return conditional_; }

 private:
  std::vector<double> conditional_;
  double mean_ = 0, spread_c_ = 0, proposal_rate_ = 1;
  std::unordered_map<RequestId, double> level_;  // u / m per request
};

// What an n-gram lookup gave one request at each of its decode steps, recorded from its prompt and
// output by an experiment's trace (experiments/draft_profile.h): after g output tokens, the lookup
// of up to the most drafts found found[g - 1] of them, and the output's next tokens matched the
// first matched[g - 1]. A lookup of fewer drafts gives a prefix of the same ones, so under greedy
// decoding a step asking for k drafts gets min(k, found) and accepts min(k, found, matched): the
// run's acceptance replayed exactly, including how it runs in spans (copied text) and which
// requests have them, which per-position probabilities average away.
struct DraftProfile {
  std::vector<int32_t> found, matched;  // [output tokens - 1]
};

// Replays each request's DraftProfile; requests without one, and steps past its end, use `fallback`.
class ProfileAcceptance final : public AcceptanceModel {
 public:
  explicit ProfileAcceptance(std::unique_ptr<AcceptanceModel> fallback) : fallback_(std::move(fallback)) {}
  void Add(RequestId id, DraftProfile p) { profiles_[id] = std::move(p); }

  int32_t Proposed(RequestId id, int32_t k, int32_t generated, std::mt19937_64& rng) override;
  int32_t Accepted(RequestId id, int32_t k, int32_t generated, std::mt19937_64& rng) override;
  void Forget(RequestId id) override { fallback_->Forget(id); }  // profiles are the workload's, kept
  std::unique_ptr<AcceptanceModel> Fresh() const override {
    auto a = std::make_unique<ProfileAcceptance>(fallback_->Fresh());
    a->profiles_ = profiles_;
    return a;
  }

 private:
  // The profile's entry for a step after `generated` tokens; null: none recorded.
  const DraftProfile* Find(RequestId id, int32_t generated) const;
  std::unique_ptr<AcceptanceModel> fallback_;
  std::unordered_map<RequestId, DraftProfile> profiles_;
};

}  // namespace specula

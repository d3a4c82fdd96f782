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
  // The drafts a proposer gives when asked for k (an n-gram or suffix lookup can find none).
  virtual int32_t Proposed(RequestId id, int32_t k, std::mt19937_64& rng) { return k; }
  // The drafts accepted (0..k) when request `id` verifies k drafts.
  virtual int32_t Accepted(RequestId id, int32_t k, std::mt19937_64& rng) = 0;
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

  int32_t Accepted(RequestId id, int32_t k, std::mt19937_64& rng) override;
  // A proposer without a model finds drafts with probability `rate` (1: always, as a draft model).
  void set_proposal_rate(double rate) { proposal_rate_ = rate; }
  int32_t Proposed(RequestId id, int32_t k, std::mt19937_64& rng) override {
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

}  // namespace specula

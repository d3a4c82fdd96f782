#include "sim/acceptance.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace specula {
namespace {

// Beta(a, b) from two gamma draws.
double DrawBeta(double a, double b, std::mt19937_64& rng) {
  const double x = std::gamma_distribution<double>(a, 1.0)(rng);
  const double y = std::gamma_distribution<double>(b, 1.0)(rng);
  return x + y > 0 ? x / (x + y) : 0.5;
}

}  // namespace

absl::StatusOr<PositionalAcceptance> PositionalAcceptance::Create(std::vector<double> conditional, double spread_c) {
  if (conditional.empty()) return absl::InvalidArgumentError("acceptance: no probabilities given");
  for (size_t j = 0; j < conditional.size(); ++j) {
    if (!(conditional[j] >= 0 && conditional[j] <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("acceptance: position ", j, " has ", conditional[j], ", not in [0, 1]"));
    }
  }
  if (!(spread_c >= 0) || !std::isfinite(spread_c)) {
    return absl::InvalidArgumentError(absl::StrCat("acceptance spread: ", spread_c, " must be >= 0"));
  }
  PositionalAcceptance a;
  a.conditional_ = std::move(conditional);
  for (double p : a.conditional_) a.mean_ += p / a.conditional_.size();
  a.spread_c_ = spread_c;
  return a;
}

absl::StatusOr<PositionalAcceptance> PositionalAcceptance::FromPerPosition(const std::vector<double>& per_position,
                                                                             double spread_c) {
  std::vector<double> conditional;
  double before = 1.0;
  for (double p : per_position) {
    if (before <= 0) break;  // no verification got this far accepted: the rest is unknown
    conditional.push_back(std::clamp(p / before, 0.0, 1.0));
    before = p;
  }
  if (conditional.empty()) conditional.push_back(0.0);
  return Create(std::move(conditional), spread_c);
}

int32_t PositionalAcceptance::Accepted(RequestId id, int32_t k, int32_t, std::mt19937_64& rng) {
  double level = 1.0;
  if (spread_c_ > 0 && mean_ > 0 && mean_ < 1) {
    auto it = level_.find(id);
    if (it == level_.end()) it = level_.emplace(id, DrawBeta(spread_c_ * mean_, spread_c_ * (1 - mean_), rng) / mean_).first;
    level = it->second;
  }
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int32_t accepted = 0;
  for (int32_t j = 0; j < k; ++j) {
    const double p = std::min(1.0, level * conditional_[std::min<size_t>(j, conditional_.size() - 1)]);
    if (u(rng) >= p) break;
    ++accepted;
  }
  return accepted;
}

const DraftProfile* ProfileAcceptance::Find(RequestId id, int32_t generated) const {
  auto it = profiles_.find(id);
  if (it == profiles_.end() || generated < 1 || generated > static_cast<int32_t>(it->second.found.size())) return nullptr;
  return &it->second;
}

int32_t ProfileAcceptance::Proposed(RequestId id, int32_t k, int32_t generated, std::mt19937_64& rng) {
  const DraftProfile* p = Find(id, generated);
  return p == nullptr ? fallback_->Proposed(id, k, generated, rng) : std::min(k, p->found[generated - 1]);
}

int32_t ProfileAcceptance::Accepted(RequestId id, int32_t k, int32_t generated, std::mt19937_64& rng) {
  const DraftProfile* p = Find(id, generated);
  return p == nullptr ? fallback_->Accepted(id, k, generated, rng) : std::min(k, p->matched[generated - 1]);
}

}  // namespace specula

#include "spec/controller.h"

#include <algorithm>
#include <cmath>

#include "spec/tuning.h"

namespace specula {
namespace {

using tuning::kEngineForget;
using tuning::kMargin;
using tuning::kMaxAlpha;
using tuning::kOffEvery;
using tuning::kOffRun;
using tuning::kReach;
using tuning::kRequestWeight;
using tuning::kVerifyRelax;

// A draw from Beta(a, b), as X / (X + Y) for X ~ Gamma(a), Y ~ Gamma(b).
double SampleBeta(double a, double b, std::mt19937_64* rng) {
  const double x = std::gamma_distribution<double>(a, 1.0)(*rng);
  const double y = std::gamma_distribution<double>(b, 1.0)(*rng);
  return x + y > 0 ? x / (x + y) : 0.5;
}

}  // namespace

SpecController::SpecController(const ForwardShape& target, StepCost target_cost, std::optional<ForwardShape> draft,
                               std::unique_ptr<StepCost> draft_cost)
    : target_(target), target_cost_(std::move(target_cost)), draft_(draft), draft_cost_(std::move(draft_cost)) {
  if (!draft_) draft_cost_.reset();
  SetShapeWorks();
}

void SpecController::SetShapeWorks() {
  // The table's points (1, 2, 4, ... tokens) and the midpoints between them (in logs): the sizes a
  // choice weighs lie closer than a factor of 2 (batch 1 with 3 or 4 drafts: 4 or 5 tokens, batch
  // 8 with 1 or 2 each: 16 or 24), and with the table's points alone the one chosen more often
  // passed most of its correction to the other.
  std::vector<double> works;
  const std::vector<CostPoint>& points = target_cost_.points();
  for (size_t i = 0; i < points.size(); ++i) {
    works.push_back(points[i].flops);
    if (i + 1 < points.size()) works.push_back(std::sqrt(points[i].flops * points[i + 1].flops));
  }
  verify_shape_.SetWorks(std::move(works));
}

double SpecController::EngineAlpha() const {
  return (engine_.accepted + 1.0) / (engine_.accepted + engine_.rejected + 2.0);
}

std::pair<double, double> SpecController::Posterior(const SpecAcceptance* r, double prior) const {
  if (prior < 0) prior = EngineAlpha();
  double a = kRequestWeight * prior, b = kRequestWeight * (1.0 - prior);
  if (r != nullptr) {
    a += r->accepted;
    b += r->rejected;
  }
  return {a, b};
}

double SpecController::Alpha(const SpecAcceptance& r) const {
  const auto [a, b] = Posterior(&r);
  return a / (a + b);
}

void SpecController::ObserveAcceptance(SpecAcceptance* r, int32_t drafts, int32_t accepted) {
  if (drafts <= 0) return;
  // Under the model (each draft accepted with probability alpha until the first rejection) the
  // likelihood of a verification is alpha^accepted (1 - alpha)^[accepted < drafts].
  const double rejected = accepted < drafts ? 1.0 : 0.0;
  if (r != nullptr) {
    r->accepted += accepted;
    r->rejected += rejected;
  }
  engine_.accepted = kEngineForget * engine_.accepted + accepted;
  engine_.rejected = kEngineForget * engine_.rejected + rejected;
}

double SpecController::DraftSeconds(absl::Span<const double> flops) const {
  double t = 0;
  if (draft_cost_ == nullptr) return t;
  for (double f : flops) t += f > 0 ? draft_cost_->Predict(f) : 0.0;
  return t;
}

void SpecController::ObserveStep(double target_flops, double target_seconds, absl::Span<const double> draft_flops,
                                 double draft_seconds, bool verified) {
  // Steps past the tables' reach teach nothing: the factor would learn the extension's error, and
  // carry it into the steps the table does cover.
  if (target_flops <= kReach * target_cost_.max_flops()) {
    if (!verified) {
      target_cost_.Observe(target_flops, target_seconds);
      // What steps with drafts cost beyond the table fades while none run, so that a price learned
      // in a slow spell (another process on the cores) does not keep them off for good once it is
      // over: with tight estimates of acceptance no draw chose them again.
      verify_extra_.Relax(kVerifyRelax);
      verify_shape_.Relax(kVerifyRelax);
    } else if (const double predicted = target_cost_.Predict(target_flops) * verify_shape_.At(target_flops);
               predicted > 0) {
      // The factor learns first; the correction by size learns what it leaves.
      verify_extra_.ObserveRatio(target_seconds / predicted);
      verify_shape_.Observe(target_flops, target_seconds / (predicted * verify_extra_.factor()));
    }
  }
  const bool draft_in_reach =
      draft_cost_ != nullptr && std::all_of(draft_flops.begin(), draft_flops.end(), [&](double f) {
        return f <= kReach * draft_cost_->max_flops();
      });
  if (draft_in_reach && !draft_flops.empty()) {
    // The draft's forwards together: the factor learns from their sum.
    const double predicted = DraftSeconds(draft_flops) / draft_cost_->factor();
    if (predicted > 0) draft_cost_->ObserveRatio(draft_seconds / predicted);
  }
}

double SpecController::TargetFlops(double base_flops, absl::Span<const SpecCandidate> c,
                                   absl::Span<const int32_t> k) const {
  for (size_t i = 0; i < c.size(); ++i) {
    // Drafts at positions len .. len + k - 1, each with its logits row.
    base_flops += ForwardFlops(target_, k[i], k[i], AttendedPositions(c[i].len, k[i]));
  }
  return base_flops;
}

std::vector<double> SpecController::DraftFlops(absl::Span<const SpecCandidate> c, absl::Span<const int32_t> k) const {
  std::vector<double> flops;
  if (!draft_) return flops;
  for (size_t i = 0; i < c.size(); ++i) {
    if (k[i] > static_cast<int32_t>(flops.size())) flops.resize(k[i], 0.0);
    // Forward 0 runs the tokens the draft lags by; forward j runs draft j - 1 (position len + j - 1).
    for (int32_t j = 0; j < k[i]; ++j) {
      flops[j] += j == 0 ? FirstDraftFlops(c[i]) : ForwardFlops(*draft_, 1, 1, c[i].len + j);
    }
  }
  return flops;
}

double SpecController::FirstDraftFlops(const SpecCandidate& c) const {
  // The draft's first forward runs the tokens it lags by, the last of them with its logits row.
  return !draft_ ? 0.0 : ForwardFlops(*draft_, c.catch_up, 1, AttendedPositions(c.len - c.catch_up, c.catch_up));
}

std::vector<int32_t> SpecController::Evaluate(double base_flops, double fixed_tokens,
                                              absl::Span<const SpecCandidate> c) {
  // Sequences whose first draft is out of the target table's reach (a step larger than measured) get
  // none, and no draw: 32 sequences' draws and walks over drafts that could never be chosen were 5%
  // of a real-pair step at batch 32. The draft's forwards have no such bound (see kReach).
  const double target_room = kReach * target_cost_.max_flops() - base_flops;
  // Thompson sampling: the best choice for one draw from each request's posterior. A request known
  // well gets its mean; one with little evidence (a new request, or one whose first drafts were
  // rejected and that has not speculated since) sometimes draws high enough to try drafts again.
  // The engine-wide prior is drawn once per step, shared by the step's requests: drafts for one
  // sequence rarely pay (each draft forward costs as much for one as for the batch), so while the
  // engine knows little, every sequence must draw high together to try them. With independent draws
  // around the uniform prior's 0.5, a batch of 8 at a true 0.8 mostly never drafted, never learned,
  // and ran at 0.83x of the best fixed k.
  std::vector<double> alpha(c.size(), 0.0);  // 0: no drafts
  bool any = false;
  double engine_draw = -1;  // drawn at the first candidate in reach
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i].max_k <= 0 || ForwardFlops(target_, 1, 1, c[i].len + 1) > target_room) continue;
    if (engine_draw < 0) engine_draw = SampleBeta(engine_.accepted + 1.0, engine_.rejected + 1.0, &rng_);
    const auto [a, b] = Posterior(c[i].acceptance, engine_draw);
    alpha[i] = std::min(SampleBeta(a, b, &rng_), kMaxAlpha);
    any = true;
  }
  if (!any) return std::vector<int32_t>(c.size(), 0);
  return Select(base_flops, fixed_tokens, c, alpha);
}

std::vector<int32_t> SpecController::Choose(double base_flops, double fixed_tokens,
                                            absl::Span<const SpecCandidate> c) {
  if (off_run_ >= kOffRun && off_run_++ % kOffEvery != 0) return std::vector<int32_t>(c.size(), 0);
  std::vector<int32_t> k = Evaluate(base_flops, fixed_tokens, c);
  if (std::all_of(k.begin(), k.end(), [](int32_t x) { return x == 0; })) {
    off_run_ += off_run_ < kOffRun ? 1 : 0;
  } else {
    off_run_ = 0;
  }
  return k;
}

bool SpecController::DraftsCouldPay(int32_t max_seqs, int32_t max_k) const {
  if (draft_cost_ == nullptr) return true;  // no draft model: drafts cost only their verification
  constexpr int32_t kLen = tuning::kMeasuredContext;
  for (int32_t n = 1; n <= std::max(max_seqs, 1); n *= 2) {
    const double base = ForwardFlops(target_, n, n, n * AttendedPositions(kLen, 1));
    // Past the table's reach nothing is priced: no draft could be chosen there either.
    if (base + ForwardFlops(target_, 1, 1, kLen + 1) > kReach * target_cost_.max_flops()) break;
    std::vector<SpecCandidate> c;
    for (int32_t i = 0; i < n; ++i) c.push_back({i, max_k, kLen + 1, 1});
    const std::vector<int32_t> k = Select(base, 0, c, std::vector<double>(n, kMaxAlpha));
    if (std::any_of(k.begin(), k.end(), [](int32_t x) { return x > 0; })) return true;
  }
  return false;  // within the measured shapes; wants_larger_shapes() says whether larger ones might
}

namespace {

// a comes after b in the order of drafts: by gain, ties by (sequence, j).
bool Lower(double a_gain, size_t a_seq, int32_t a_j, double b_gain, size_t b_seq, int32_t b_j) {
  if (a_gain != b_gain) return a_gain < b_gain;
  return a_seq != b_seq ? a_seq > b_seq : a_j > b_j;
}

}  // namespace

void SpecController::PushDraft(size_t i, int32_t j, double gain, absl::Span<const SpecCandidate> c) const {
  if (j > c[i].max_k || gain < 1e-3) return;
  heap_.push_back({gain, i, j, 0, 0});
  std::push_heap(heap_.begin(), heap_.end(), [](const Draft& a, const Draft& b) {
    return Lower(a.gain, a.seq, a.j, b.gain, b.seq, b.j);
  });
}

const SpecController::Draft* SpecController::NextDraft(size_t idx, absl::Span<const SpecCandidate> c,
                                                        const std::vector<double>& alpha) const {
  while (drafts_.size() <= idx) {
    if (heap_.empty()) return nullptr;
    std::pop_heap(heap_.begin(), heap_.end(), [](const Draft& a, const Draft& b) {
      return Lower(a.gain, a.seq, a.j, b.gain, b.seq, b.j);
    });
    Draft d = heap_.back();
    heap_.pop_back();
    const SpecCandidate& ci = c[d.seq];
    d.target_flops = ForwardFlops(target_, 1, 1, ci.len + d.j);
    d.draft_flops = !draft_ ? 0.0 : d.j == 1 ? FirstDraftFlops(ci) : ForwardFlops(*draft_, 1, 1, ci.len + d.j - 1);
    drafts_.push_back(d);
    PushDraft(d.seq, d.j + 1, d.gain * alpha[d.seq], c);
  }
  return &drafts_[idx];
}

std::vector<double> SpecController::LevelGains(absl::Span<const SpecCandidate> c, const std::vector<double>& alpha,
                                               double* first_forward) const {
  std::vector<double> level_gain(1, 0.0);  // [j]
  *first_forward = draft_cost_ != nullptr ? 1e30 : 0.0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (alpha[i] < 1e-3) continue;
    if (draft_cost_ != nullptr) *first_forward = std::min(*first_forward, draft_cost_->Predict(FirstDraftFlops(c[i])));
    double gain = 1.0;
    for (int32_t j = 1; j <= c[i].max_k; ++j) {
      gain *= alpha[i];
      if (gain < 1e-3) break;
      if (static_cast<size_t>(j) >= level_gain.size()) level_gain.resize(j + 1, 0.0);
      level_gain[j] += gain;
    }
    PushDraft(i, 1, alpha[i], c);
  }
  return level_gain;
}

std::vector<int32_t> SpecController::Select(double base_flops, double fixed_tokens, absl::Span<const SpecCandidate> c,
                                            const std::vector<double>& alpha) const {
  const size_t n = c.size();
  drafts_.clear();
  heap_.clear();
  double first_forward = 0;
  const std::vector<double> level_gain = LevelGains(c, alpha, &first_forward);  // [j]
  auto at = [&](size_t idx) { return NextDraft(idx, c, alpha); };
  const int32_t max_k = static_cast<int32_t>(level_gain.size()) - 1;

  std::vector<int32_t> best(n, 0), k(n);
  const double table_max = target_cost_.max_flops(), target_reach = kReach * table_max;
  std::vector<double> forwards;  // [cap] the draft's forwards' work
  // Drafts must beat the plain step by kMargin: where they gain less, the cost model's errors decide.
  double best_goodput =
      (1 + kMargin) * (fixed_tokens + static_cast<double>(n)) / std::max(target_cost_.Predict(base_flops), 1e-9);
  // The draft runs as many forwards as the longest proposal, so drafts cost less once that many are
  // paid for: one walk per cap on the forwards, each adding drafts in order of gain, keeping the
  // prefix of largest goodput (the best set is a prefix for its cap).
  // The draft's time is a running sum: adding a draft changes one forward's prediction (this runs
  // every step, and the real pair's steps take ~60 us).
  //
  // A prefix of cap c's walk that uses fewer than c forwards is also a prefix of a smaller cap's
  // walk (a sequence's gains fall with j), so cap c only matters if c forwards can pay: it is
  // skipped when even all its drafts (every one with j <= c) over the target's base step plus c of
  // the draft's forwards at their cheapest cannot beat the best so far: the first at least one
  // sequence's catch-up, each later one at least the table's smallest forward.
  const double base_seconds = VerifiedSeconds(base_flops);  // any step with drafts
  const double min_forward = draft_cost_ != nullptr ? draft_cost_->Predict(1e-30) : 0.0;
  double max_tokens = fixed_tokens + static_cast<double>(n);
  for (int32_t cap = 1; cap <= max_k; ++cap) {
    max_tokens += level_gain[cap];
    if (max_tokens / std::max(base_seconds + first_forward + (cap - 1) * min_forward, 1e-9) <= best_goodput) continue;
    std::fill(k.begin(), k.end(), 0);
    forwards.assign(cap, 0.0);
    double target = base_flops, tokens = fixed_tokens + static_cast<double>(n), draft_seconds = 0;
    // The walk ends once even every remaining draft at no further cost could not beat the best:
    // time never falls as drafts are added. (Full walks over 32 sequences' drafts made auto 13%
    // slower than no speculation on the real pair, which it never speculated on.)
    double remaining = max_tokens - tokens, seconds = base_seconds;
    for (size_t idx = 0;; ++idx) {
      const Draft* next = at(idx);
      if (next == nullptr) break;
      const Draft& d = *next;
      if (d.j > cap) continue;
      if ((tokens + remaining) / std::max(seconds, 1e-9) <= best_goodput) break;
      remaining -= d.gain;
      // Not measured that far yet: every further draft adds target work.
      if (target + d.target_flops > target_reach) break;
      double& f = forwards[d.j - 1];
      ++k[d.seq];  // == d.j: a sequence's drafts come in order of j
      target += d.target_flops;
      if (draft_cost_ != nullptr) draft_seconds -= f > 0 ? draft_cost_->Predict(f) : 0.0;
      f += d.draft_flops;
      if (draft_cost_ != nullptr) draft_seconds += f > 0 ? draft_cost_->Predict(f) : 0.0;
      tokens += d.gain;
      seconds = VerifiedSeconds(target) + draft_seconds;
      if (!wants_larger_shapes_ && target > table_max &&
          tokens / std::max(target_cost_.PredictLine(target) * verify_extra_.factor() * verify_shape_.At(target) + draft_seconds, 1e-9) >
              best_goodput) {
        wants_larger_shapes_ = true;
      }
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

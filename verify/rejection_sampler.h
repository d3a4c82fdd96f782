// Verification of draft tokens against the target, in the words of the papers (Leviathan et al.
// 2023; Chen et al. 2023): each draft token is *accepted* with probability min(1, p/q); at the
// first rejection a *recovered* token is sampled from norm(max(0, p - q)); when all k drafts are
// accepted a *bonus* token is sampled from the target's next distribution. Greedy verification is
// the temperature-0 case: accept while the draft equals the target's argmax.
//
// p and q are the already-processed sampling distributions (temperature, top-k, top-p applied the
// same way to both). A proposer without probabilities (n-gram) has a one-hot q.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "core/batch.h"

namespace specula {

struct VerifyResult {
  std::vector<TokenId> tokens;  // accepted drafts, then one recovered or bonus token
  int32_t num_accepted = 0;
  bool bonus = false;  // all drafts accepted
};

// Uniform [0, 1) source; tests substitute fixed values.
class Uniform {
 public:
  explicit Uniform(uint64_t seed) : rng_(seed) {}
  virtual ~Uniform() = default;
  virtual double Next() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

 private:
  std::mt19937_64 rng_;
};

// draft: [k]; target_probs: [k + 1, vocab] (row i scores the token after draft i-1);
// draft_probs: [k, vocab], or empty for one-hot drafts.
VerifyResult RejectionSample(absl::Span<const TokenId> draft, absl::Span<const float> target_probs,
                             absl::Span<const float> draft_probs, int32_t vocab, Uniform& uniform);

// target_argmax: [k + 1].
VerifyResult GreedyVerify(absl::Span<const TokenId> draft, absl::Span<const TokenId> target_argmax);

// Acceptance statistics, per request and in total (vLLM's spec-decode counters).
struct SpecStats {
  int64_t drafts = 0;           // verification steps that carried draft tokens
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;  // [k_max]
  // [k_max]: verifications that verified draft i with every draft before it accepted. With k that
  // varies by step, accepted_per_position[i] / reached_per_position[i] is draft i's acceptance given
  // the drafts before it were accepted; accepted_per_position[i] / drafts is not (a verification of
  // fewer drafts never reaches i).
  std::vector<int64_t> reached_per_position;
  // [k_max + 1]: verifications by the number of drafts they accepted (entry j: exactly j, the bonus
  // token not counted); its entries add up to `drafts`.
  std::vector<int64_t> acceptance_histogram;
  // Structured output: drafts the grammar forced (its only continuation; counted in draft_tokens
  // too), those accepted, and a proposer's drafts cut where they left the grammar (never verified).
  int64_t forced_tokens = 0;
  int64_t forced_accepted = 0;
  int64_t cut_tokens = 0;

  void Record(int32_t num_drafts, int32_t num_accepted);
  // A verification whose num_forced drafts the grammar forced (0: the proposer's), num_accepted
  // accepted, after num_cut of the proposer's were cut.
  void RecordGrammar(int32_t num_forced, int32_t num_accepted, int32_t num_cut);
  void Merge(const SpecStats& o);
  double acceptance_rate() const { return draft_tokens ? static_cast<double>(accepted_tokens) / draft_tokens : 0.0; }
  // Tokens per verification step: 1 + accepted / drafts.
  double mean_acceptance_length() const { return drafts ? 1.0 + static_cast<double>(accepted_tokens) / drafts : 0.0; }
};

}  // namespace specula

#include "verify/rejection_sampler.h"

#include <algorithm>

#include "core/categorical.h"

namespace specula {

VerifyResult RejectionSample(absl::Span<const TokenId> draft, absl::Span<const float> target_probs,
                             absl::Span<const float> draft_probs, int32_t vocab, Uniform& uniform) {
  VerifyResult r;
  const size_t k = draft.size();
  std::vector<float> residual(vocab);  // [vocab] max(0, p - q)
  for (size_t i = 0; i < k; ++i) {
    const float* p = target_probs.data() + i * vocab;
    const TokenId x = draft[i];
    const float q_x = draft_probs.empty() ? 1.0f : draft_probs[i * vocab + x];
    const double accept = q_x > 0.0f ? std::min(1.0, static_cast<double>(p[x]) / q_x) : 0.0;
    if (uniform.Next() < accept) {
      r.tokens.push_back(x);  // accepted
      ++r.num_accepted;
      continue;
    }
    // Rejected: the recovered token comes from norm(max(0, p - q)).
    double mass = 0.0;
    for (int32_t v = 0; v < vocab; ++v) {
      const float q_v = draft_probs.empty() ? (v == x ? 1.0f : 0.0f) : draft_probs[i * vocab + v];
      residual[v] = std::max(0.0f, p[v] - q_v);
      mass += residual[v];
    }
    // p == q up to rounding leaves no residual mass; p itself is then the right distribution.
    r.tokens.push_back(mass > 0.0 ? SampleCategorical(residual, uniform.Next())
                                  : SampleCategorical(absl::MakeConstSpan(p, vocab), uniform.Next()));
    return r;
  }
  r.bonus = true;
  r.tokens.push_back(SampleCategorical(target_probs.subspan(k * vocab, vocab), uniform.Next()));
  return r;
}

VerifyResult GreedyVerify(absl::Span<const TokenId> draft, absl::Span<const TokenId> target_argmax) {
  VerifyResult r;
  for (size_t i = 0; i < draft.size(); ++i) {
    if (draft[i] != target_argmax[i]) {
      r.tokens.push_back(target_argmax[i]);  // the target's own token replaces the first mismatch
      return r;
    }
    r.tokens.push_back(draft[i]);
    ++r.num_accepted;
  }
  r.bonus = true;
  r.tokens.push_back(target_argmax[draft.size()]);
  return r;
}

void SpecStats::Record(int32_t num_drafts, int32_t num_accepted) {
  if (num_drafts == 0) return;
  ++drafts;
  draft_tokens += num_drafts;
  accepted_tokens += num_accepted;
  if (static_cast<int32_t>(accepted_per_position.size()) < num_drafts) accepted_per_position.resize(num_drafts, 0);
  if (static_cast<int32_t>(reached_per_position.size()) < num_drafts) reached_per_position.resize(num_drafts, 0);
  for (int32_t i = 0; i < num_accepted; ++i) ++accepted_per_position[i];
  for (int32_t i = 0; i <= std::min(num_accepted, num_drafts - 1); ++i) ++reached_per_position[i];
  if (static_cast<int32_t>(acceptance_histogram.size()) <= num_drafts) acceptance_histogram.resize(num_drafts + 1, 0);
  ++acceptance_histogram[num_accepted];
}

void SpecStats::RecordGrammar(int32_t num_forced, int32_t num_accepted, int32_t num_cut) {
  forced_tokens += num_forced;
  forced_accepted += std::clamp(num_accepted, 0, num_forced);
  cut_tokens += num_cut;
}

namespace {

void AddCounts(std::vector<int64_t>* into, const std::vector<int64_t>& from) {
  if (into->size() < from.size()) into->resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) (*into)[i] += from[i];
}

}  // namespace

void SpecStats::Merge(const SpecStats& o) {
  drafts += o.drafts;
  draft_tokens += o.draft_tokens;
  accepted_tokens += o.accepted_tokens;
  forced_tokens += o.forced_tokens;
  forced_accepted += o.forced_accepted;
  cut_tokens += o.cut_tokens;
  AddCounts(&accepted_per_position, o.accepted_per_position);
  AddCounts(&reached_per_position, o.reached_per_position);
  AddCounts(&acceptance_histogram, o.acceptance_histogram);
}

}  // namespace specula

#include "verify/verify.h"

#include <algorithm>
#include <vector>

#include "core/categorical.h"

namespace specula {
namespace {

// Accepts each draft with probability alpha until the first rejection; `next` gives the target's
// token after the accepted ones.
template <typename Next>
VerifyResult Synthetic(absl::Span<const TokenId> drafts, double alpha, Uniform& uniform, Next next) {
  VerifyResult r;
  const int32_t k = static_cast<int32_t>(drafts.size());
  r.num_accepted = SyntheticAccepted(k, alpha, uniform);
  r.tokens.assign(drafts.begin(), drafts.begin() + r.num_accepted);
  r.bonus = r.num_accepted == k;
  r.tokens.push_back(next(r.num_accepted));
  return r;
}

}  // namespace

int32_t SyntheticAccepted(int32_t k, double alpha, Uniform& uniform) {
  int32_t accepted = 0;
  while (accepted < k && uniform.Next() < alpha) ++accepted;
  return accepted;
}

VerifyResult VerifyArgmax(absl::Span<const TokenId> drafts, absl::FunctionRef<TokenId(int32_t)> argmax,
                          Uniform& uniform, double synthetic_alpha) {
  const int32_t k = static_cast<int32_t>(drafts.size());
  if (synthetic_alpha >= 0) {
    return Synthetic(drafts, synthetic_alpha, uniform, [&](int32_t accepted) {
      uniform.Next();  // the draw a one-hot distribution ignores, so the stream stays the general path's
      return argmax(accepted);
    });
  }
  std::vector<TokenId> rows;  // [rows read]: up to the first mismatch, or all k + 1
  for (int32_t i = 0; i <= k; ++i) {
    rows.push_back(argmax(i));
    if (i < k && rows[i] != drafts[i]) break;
  }
  return GreedyVerify(drafts.subspan(0, std::min<size_t>(rows.size(), k)), rows);
}

VerifyResult Verify(absl::Span<const float> logits, int32_t vocab, DraftChain draft, const SamplingParams& params,
                    absl::Span<const TokenId> history, Uniform& uniform, double synthetic_alpha) {
  const int32_t k = static_cast<int32_t>(draft.tokens.size());
  auto row = [&](int32_t i) { return logits.subspan(static_cast<size_t>(i) * vocab, vocab); };
  if (params.temperature == 0.0f && !params.ProcessesLogits()) {
    // Greedy without a penalty: each row's distribution is one-hot at its argmax, so only the rows up
    // to the first rejection are read, once each (building the k + 1 distributions took five passes
    // over every row: a batch of 8 verifying 2 drafts each spent ~15% of its step there).
    return VerifyArgmax(draft.tokens, [&](int32_t i) { return static_cast<TokenId>(Argmax(row(i))); }, uniform,
                        synthetic_alpha);
  }
  // The target's sampling distribution after each prefix: rows i = 0..k, history + drafts[0, i).
  thread_local std::vector<float> target_probs, row_probs;  // [k + 1, vocab], [vocab]
  std::vector<TokenId> prefix(history.begin(), history.end());
  target_probs.resize(static_cast<size_t>(k + 1) * vocab);
  for (int32_t i = 0; i <= k; ++i) {
    SamplingProbabilities(params, row(i), prefix, &row_probs);
    std::copy(row_probs.begin(), row_probs.end(), target_probs.begin() + static_cast<size_t>(i) * vocab);
    if (i < k) prefix.push_back(draft.tokens[i]);
  }
  auto p = [&](int32_t i) { return absl::MakeConstSpan(target_probs).subspan(static_cast<size_t>(i) * vocab, vocab); };
  if (synthetic_alpha >= 0) {
    return Synthetic(draft.tokens, synthetic_alpha, uniform,
                     [&](int32_t accepted) { return SampleCategorical(p(accepted), uniform.Next()); });
  }
  if (params.temperature == 0.0f) {
    std::vector<TokenId> argmax(k + 1);  // the (penalized) distributions are one-hot at their argmax
    for (int32_t i = 0; i <= k; ++i) argmax[i] = static_cast<TokenId>(std::max_element(p(i).begin(), p(i).end()) - p(i).begin());
    return GreedyVerify(draft.tokens, argmax);
  }
  return RejectionSample(draft.tokens, target_probs, draft.probs, vocab, uniform);
}

}  // namespace specula

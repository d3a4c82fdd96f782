#include "experiments/draft_profile.h"

#include <vector>

namespace specula::experiments {

DraftProfile NgramDraftProfile(const NgramProposer& lookup, absl::Span<const TokenId> prompt,
                               absl::Span<const TokenId> output, int32_t max_k) {
  DraftProfile p;
  std::vector<TokenId> seq(prompt.begin(), prompt.end());  // [prompt + g]: the sequence at step g
  for (size_t g = 1; g < output.size(); ++g) {
    seq.push_back(output[g - 1]);
    const std::vector<TokenId> drafts = lookup.Lookup(seq, max_k);
    int32_t matched = 0;
    while (matched < static_cast<int32_t>(drafts.size()) && g + matched < output.size() &&
           drafts[matched] == output[g + matched]) {
      ++matched;
    }
    p.found.push_back(static_cast<int32_t>(drafts.size()));
    p.matched.push_back(matched);
  }
  return p;
}

}  // namespace specula::experiments

#include "draft/ngram_proposer.h"

#include <algorithm>

namespace specula {

std::vector<TokenId> NgramProposer::Lookup(absl::Span<const TokenId> tokens, int32_t k) const {
  const int32_t len = static_cast<int32_t>(tokens.size());
  for (int32_t n = std::min(max_n_, len - 1); n >= min_n_; --n) {
    const auto suffix = tokens.subspan(len - n, n);
    // Latest earlier occurrence of the suffix that has at least one token after it.
    for (int32_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int32_t from = start + n;
      const int32_t count = std::min(k, len - from);
      return std::vector<TokenId>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

absl::Status NgramProposer::Propose(absl::Span<const ProposeInput> inputs, std::vector<Proposal>* out) {
  out->assign(inputs.size(), Proposal{});
  for (size_t i = 0; i < inputs.size(); ++i) (*out)[i].tokens = Lookup(inputs[i].tokens, inputs[i].k);
  return absl::OkStatus();
}

}  // namespace specula

#include "draft/suffix_proposer.h"

#include <algorithm>

namespace specula {

SuffixIndex& SuffixProposer::Sync(ProposerSlot& state, absl::Span<const TokenId> tokens) {
  auto* own = static_cast<Own*>(state.get());
  if (own != nullptr) {
    const absl::Span<const TokenId> have = own->index.sequence(own->seq);
    // Sequences only grow between preemptions; anything else starts over.
    if (have.size() <= tokens.size() && (have.empty() || tokens[have.size() - 1] == have.back())) {
      own->index.Extend(own->seq, tokens.subspan(have.size()));
      return own->index;
    }
  }
  auto fresh = std::make_unique<Own>();
  own = fresh.get();
  state = std::move(fresh);
  own->seq = own->index.Add(tokens);
  return own->index;
}

std::vector<TokenId> SuffixProposer::Draft(ProposerSlot& state, absl::Span<const TokenId> tokens, int32_t k) {
  const SuffixDraft mine = Sync(state, tokens).Speculate(tokens, k, params_);
  SuffixDraft shared = cache_.Speculate(tokens, k, params_);
  if (shared.score > mine.score) {
    cache_.Touch(shared);
    return std::move(shared.tokens);
  }
  return mine.tokens;
}

absl::Status SuffixProposer::Propose(absl::Span<const ProposeInput> inputs, std::vector<Proposal>* out) {
  out->assign(inputs.size(), Proposal{});
  for (size_t i = 0; i < inputs.size(); ++i) (*out)[i].tokens = Draft(*inputs[i].state, inputs[i].tokens, inputs[i].k);
  return absl::OkStatus();
}

void SuffixProposer::Finished(ProposerState*, absl::Span<const TokenId> tokens, int32_t num_prompt) {
  const int32_t from = std::clamp(num_prompt - params_.max_depth, 0, static_cast<int32_t>(tokens.size()));
  cache_.Insert(tokens.subspan(from));
}

}  // namespace specula

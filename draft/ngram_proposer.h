// Prompt lookup: the last n tokens (n from max_n down to min_n) are matched against the
// sequence's own prompt and output, and what followed the latest earlier match is proposed. No
// model, no probabilities (the drafts are one-hot).
#pragma once

#include "draft/proposer.h"

namespace specula {

class NgramProposer final : public Proposer {
 public:
  NgramProposer(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {}
  absl::Status Propose(absl::Span<const ProposeInput> inputs, std::vector<Proposal>* out) override;

  // The drafts for one sequence (exposed for tests).
  std::vector<TokenId> Lookup(absl::Span<const TokenId> tokens, int32_t k) const;

 private:
  int32_t min_n_, max_n_;
};

}  // namespace specula

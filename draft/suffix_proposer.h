// Suffix decoding (Arctic Inference's SuffixDecoding, as in vLLM and SGLang): drafts from the
// longest match of the sequence's suffix in two indexes (draft/suffix_index.h), one over the
// request's own prompt and output, built as its tokens arrive, and one over recent finished
// requests, bounded in tokens with LRU eviction; the draft with the higher score wins. No model, no
// probabilities (the drafts are one-hot).
//
// A request enters the shared cache once, when it finishes (Finish, with its whole sequence): a
// preemption's Release drops only its own index, rebuilt from the sequence when it comes back, so
// nothing is inserted twice. What it caches is the output and, before it, max_depth tokens of the
// prompt: the context a later request's match needs to reach the output (its prompt's earlier
// tokens could only ever draft more prompt).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "draft/proposer.h"
#include "draft/suffix_index.h"

namespace specula {

class SuffixProposer final : public Proposer {
 public:
  SuffixProposer(const SuffixParams& params, int64_t cache_tokens)
      : params_(params), cache_(cache_tokens, std::min(2, params.max_depth)) {}
  absl::Status Propose(absl::Span<const ProposeInput> inputs, std::vector<Proposal>* out) override;
  void Finished(ProposerState* state, absl::Span<const TokenId> tokens, int32_t num_prompt) override;

  // The drafts for one sequence (exposed for tests): its own index (in `state`) brought up to
  // `tokens`, then the better of its draft and the cache's.
  std::vector<TokenId> Draft(ProposerSlot& state, absl::Span<const TokenId> tokens, int32_t k);
  const SuffixCache& cache() const { return cache_; }

 private:
  struct Own : ProposerState {  // a request's own suffix index
    SuffixIndex index;
    int32_t seq = 0;  // the request's sequence in `index`
  };
  // The request's index, holding exactly `tokens`.
  SuffixIndex& Sync(ProposerSlot& state, absl::Span<const TokenId> tokens);

  SuffixParams params_;
  SuffixCache cache_;
};

}  // namespace specula

// Proposers draft k tokens for each speculating sequence of a step. The target then scores all of
// them in one forward pass and the verifier (verify/) accepts a prefix.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/step.h"
#include "model/forward_cost.h"
#include "model/sampler.h"

namespace specula {

class Backend;

// A proposer's own state for one request (a draft model's KV blocks and stream, a suffix index),
// held in the request's record and handed to the proposer with every call about that request, so
// that finishing the request (dropping its record) frees it.
struct ProposerState {
  virtual ~ProposerState() = default;
};
using ProposerSlot = std::unique_ptr<ProposerState>;

// The grammar a constrained request's drafts stay in (structured output), at the position of the
// next draft. A proposer that samples (a draft model) masks each draft's distribution with it and
// follows the draft it chose, so that its q is the masked q; one that looks drafts up (n-gram,
// suffix) may ignore it: the engine cuts a draft where it leaves the grammar.
class DraftGrammar {
 public:
  virtual ~DraftGrammar() = default;
  // Sets the logits of the tokens the grammar refuses next to -inf. logits: [the draft's vocab].
  virtual void Mask(absl::Span<float> logits) = 0;
  // Follows a chosen draft. False: the grammar refused it or ended with it, and drafting stops.
  virtual bool Advance(TokenId token) = 0;
};

struct ProposeInput {
  RequestId id = 0;
  ProposerSlot* state = nullptr;  // the request's slot: a proposer that keeps state fills it on first use
  // The sequence so far; its last token has not been run through the target yet.
  absl::Span<const TokenId> tokens;
  int32_t k = 0;  // drafts wanted
  const SamplingParams* sampling = nullptr;
  DraftGrammar* grammar = nullptr;  // null: the request is not constrained
};

struct Proposal {
  std::vector<TokenId> tokens;  // at most k (an n-gram miss gives none)
  std::vector<float> probs;     // [tokens, vocab] draft distributions q, or empty (one-hot drafts)
  // Or q left where the proposer computed it: [tokens, vocab] f32 in probs_backend's memory, valid
  // until the proposer's next Propose (probs is then empty).
  const float* backend_probs = nullptr;
  Backend* probs_backend = nullptr;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // out->size() == inputs.size() on return.
  virtual absl::Status Propose(absl::Span<const ProposeInput> inputs, std::vector<Proposal>* out) = 0;
  // After verification only the first `num_valid` tokens of the sequence have target KV; drafted
  // state past them is dropped by moving a watermark.
  virtual void Rollback(ProposerState* state, int32_t num_valid) {}
  // The request was preempted (its KV is recomputed later): by default its state goes.
  virtual void Preempted(ProposerSlot& state) { state.reset(); }
  // The request finished for good with these tokens, the first num_prompt its prompt: what a
  // proposer that learns across requests learns. Its state goes with its record afterwards.
  virtual void Finished(ProposerState* state, absl::Span<const TokenId> tokens, int32_t num_prompt) {}
  // Blocks the proposer holds (leak tests).
  virtual int32_t blocks_in_use() const { return 0; }

  // For adaptive speculation. A proposer with a model of its own (the draft model) gives its shape
  // and measures its forwards (model/forward_cost.h); one without (n-gram) has neither and costs
  // nothing.
  virtual const ModelConfig* model_config() const { return nullptr; }
  virtual absl::StatusOr<std::vector<CostPoint>> MeasureCost(const CostGrid& grid) {
    return std::vector<CostPoint>{};
  }
  // Tokens of a sequence of `len` tokens that the proposer's model must run before its first draft:
  // its state lags the target's by the tokens accepted since, or decoded without drafts.
  virtual int32_t CatchUpTokens(const ProposerState* state, int32_t len) const { return 0; }
};

}  // namespace specula

// One sequence's verification of its drafts, in the papers' terms (verify/rejection_sampler.h):
// the target's logits rows score the last known token and each draft; drafts are *accepted* while
// they pass, then one *recovered* token replaces the first rejected draft, or a *bonus* token
// follows when all were accepted. Lossless: greedy output equals the target's own, and sampled
// output follows its distribution.
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "core/batch.h"
#include "model/sampler.h"
#include "verify/rejection_sampler.h"

namespace specula {

class Backend;

struct DraftChain {
  absl::Span<const TokenId> tokens;  // [k]
  absl::Span<const float> probs;     // [k, vocab]: the draft's distributions q, or empty (one-hot drafts)
  // Or q in a backend's memory ([k, vocab] f32; BackendVerifier only: Verify reads `probs`).
  const float* backend_probs = nullptr;
  Backend* probs_backend = nullptr;
};

// logits: [k + 1, vocab], row i scoring the token after history + drafts[0, i). history: the
// sequence so far (for the repetition penalty). `uniform` is the request's verification stream.
// synthetic_alpha >= 0 (cost studies only, not lossless): each draft is accepted with that
// probability instead, and the next token is the target's.
// Touches only its arguments and per-thread scratch: sequences are verified in parallel.
VerifyResult Verify(absl::Span<const float> logits, int32_t vocab, DraftChain draft, const SamplingParams& params,
                    absl::Span<const TokenId> history, Uniform& uniform, double synthetic_alpha = -1);

// Greedy verification (no repetition penalty) from the argmax of each row, `argmax(i)` for row
// i = 0..k, asked only for the rows it needs: Verify's greedy path, for callers whose rows are
// elsewhere (a backend's Argmax). The synthetic case and its draws are Verify's.
VerifyResult VerifyArgmax(absl::Span<const TokenId> drafts, absl::FunctionRef<TokenId(int32_t)> argmax,
                          Uniform& uniform, double synthetic_alpha = -1);

// Synthetic acceptance: how many of k drafts pass, each with probability alpha, until the first
// that fails (the draws Verify takes before the next token's).
int32_t SyntheticAccepted(int32_t k, double alpha, Uniform& uniform);

}  // namespace specula

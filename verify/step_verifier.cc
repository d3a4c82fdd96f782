#include "verify/step_verifier.h"

#include "core/status_macros.h"

namespace specula {

StepVerifier::StepVerifier(Backend* backend, double synthetic_alpha)
    : backend_(backend != nullptr ? std::make_unique<BackendVerifier>(backend) : nullptr),
      synthetic_alpha_(synthetic_alpha) {}

absl::StatusOr<std::vector<VerifyResult>> StepVerifier::Run(absl::Span<const float> host_logits,
                                                            const float* backend_logits, int32_t rows, int32_t vocab,
                                                            absl::Span<const RowsToVerify> seqs) {
  if (backend_ == nullptr) return RunOnHost(host_logits, rows, vocab, seqs);
  std::vector<VerifyResult> results;
  RETURN_IF_ERROR(backend_->Run(backend_logits, rows, vocab, seqs, synthetic_alpha_, &results));
  return results;
}

absl::StatusOr<std::vector<VerifyResult>> StepVerifier::RunOnHost(absl::Span<const float> logits, int32_t rows,
                                                                  int32_t vocab, absl::Span<const RowsToVerify> seqs) {
  // Draft distributions a proposer left in its backend come to the host first, one at a time (a
  // backend's stream is not for several threads).
  host_q_.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DraftChain& d = seqs[i].draft;
    host_q_[i].clear();
    if (!d.probs.empty() || d.backend_probs == nullptr) continue;
    host_q_[i].resize(d.tokens.size() * static_cast<size_t>(vocab));
    d.probs_backend->CopyOut(host_q_[i].data(), d.backend_probs, host_q_[i].size() * sizeof(float));
    RETURN_IF_ERROR(d.probs_backend->Sync());
  }
  std::vector<VerifyResult> out(seqs.size());  // [seqs]
  const int64_t num = static_cast<int64_t>(seqs.size());
  // Every sequence's new tokens over every core: a sampled row is a pass over the vocabulary (an
  // argmax when greedy), 2.6% of a 32-sequence step on one core while the others waited, and a
  // verification up to k + 1 of them (hence a dynamic schedule). Each sequence has its own sampler
  // and verification stream, so any order gives the same tokens.
#pragma omp parallel for schedule(dynamic) if (rows >= 8)
  for (int64_t i = 0; i < num; ++i) {
    const RowsToVerify& s = seqs[i];
    const float* row = s.host_rows.empty() ? logits.data() + static_cast<size_t>(s.first_row) * vocab : s.host_rows.data();
    if (!s.proposed) {
      out[i].tokens = {s.sampler->Sample(absl::MakeConstSpan(row, vocab), s.history)};
      continue;
    }
    const DraftChain& d = s.draft;
    const auto rows_of = absl::MakeConstSpan(row, (d.tokens.size() + 1) * static_cast<size_t>(vocab));
    const absl::Span<const float> q = host_q_[i].empty() ? d.probs : absl::MakeConstSpan(host_q_[i]);
    out[i] = Verify(rows_of, vocab, {d.tokens, q}, *s.params, s.history, *s.uniform, synthetic_alpha_);
  }
  return out;
}

}  // namespace specula

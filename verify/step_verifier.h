// A step's verification in one place: every sampling sequence's tokens, chosen where the logits are
// (BackendVerifier, on a device) or on the host (Verify, the sequences in parallel), with the draft
// distributions a proposer left in its backend brought to the host first.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "verify/backend_verify.h"

namespace specula {

class StepVerifier {
 public:
  // `backend`: where the logits stay and the tokens are chosen, or null: on the host.
  // synthetic_alpha as Verify's.
  StepVerifier(Backend* backend, double synthetic_alpha);
  bool on_backend() const { return backend_ != nullptr; }

  // logits: [rows, vocab], on the host (host_logits) or in the backend (backend_logits), whichever
  // on_backend() reads. Returns each sequence's tokens ([seqs]).
  absl::StatusOr<std::vector<VerifyResult>> Run(absl::Span<const float> host_logits, const float* backend_logits,
                                                int32_t rows, int32_t vocab, absl::Span<const RowsToVerify> seqs);

 private:
  absl::StatusOr<std::vector<VerifyResult>> RunOnHost(absl::Span<const float> logits, int32_t rows, int32_t vocab,
                                                      absl::Span<const RowsToVerify> seqs);

  std::unique_ptr<BackendVerifier> backend_;
  const double synthetic_alpha_;
  std::vector<std::vector<float>> host_q_;  // [seqs][k * vocab]: q a proposer left in its backend (within Run)
};

}  // namespace specula

// A step's tokens chosen where its logits are (a GPU): greedy rows by the backend's Argmax, sampled
// rows by its Sample, drafts by its VerifyDrafts (rejection sampling, recovered and bonus tokens).
// Only token ids and acceptance counts come back to the host. The rules are Verify's
// (verify/verify.h), and so are the draws each sequence takes from its streams.
//
// A sequence whose sampling the backend does not do (repetition penalty, min-p) has its rows copied
// to the host and goes through Verify there.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/sample_args.h"
#include "model/sampler.h"
#include "verify/verify.h"

namespace specula {

// One sampling sequence of the step.
struct RowsToVerify {
  int32_t first_row = 0;  // its logits rows: first_row .. first_row + draft.tokens.size()
  DraftChain draft;       // no tokens: one row, sampled plainly
  const SamplingParams* params = nullptr;
  absl::Span<const TokenId> history;  // the sequence so far (the host path's repetition penalty)
  Sampler* sampler = nullptr;         // a plain row's draw
  Uniform* uniform = nullptr;         // the verification stream
  // A proposer was asked (its chain may be empty: an n-gram miss). On the host such a row goes
  // through Verify and its stream's draws, as a verification would; one never asked is sampled.
  bool proposed = false;
  // Its rows already on the host ([k + 1, vocab]: a constrained sequence's, masked there): verified
  // there whatever the place of the others.
  absl::Span<const float> host_rows;
};

class BackendVerifier {
 public:
  explicit BackendVerifier(Backend* backend) : be_(backend) {}

  // logits: [rows, vocab] in the backend's memory. out[i]: sequence i's tokens (a plain row's one
  // token, none accepted). synthetic_alpha as Verify's.
  absl::Status Run(const float* logits, int32_t rows, int32_t vocab, absl::Span<const RowsToVerify> seqs,
                   double synthetic_alpha, std::vector<VerifyResult>* out);

 private:
  // How each sequence is verified.
  enum class Route { kGreedy, kSampled, kHost };

  void LaunchArgmax(const float* logits, int32_t rows, int32_t vocab);
  void LaunchSample(const float* logits, int32_t rows, int32_t vocab, absl::Span<const RowsToVerify> seqs,
                    double synthetic_alpha);
  void LaunchVerify(int32_t vocab, absl::Span<const RowsToVerify> seqs);
  const float* DraftProbs(int32_t vocab, absl::Span<const RowsToVerify> seqs);
  void CopyHostRows(const float* logits, int32_t vocab, absl::Span<const RowsToVerify> seqs);
  VerifyResult Collect(size_t i, const RowsToVerify& s, int32_t vocab, double synthetic_alpha);
  // Copies a host vector into a backend buffer grown to hold it.
  template <typename T>
  absl::Status Upload(const std::vector<T>& host, BackendBuffer* dev);

  Backend* be_;
  absl::Status status_;
  std::vector<Route> route_;          // [seqs]
  std::vector<int32_t> spec_index_;   // [seqs]: the sequence's index in the VerifyDrafts batch, or -1
  std::vector<int32_t> accepted_;     // [seqs]: synthetic acceptance drawn on the host

  // Argmax of every row.
  BackendBuffer argmax_dev_;          // [rows] i32
  std::vector<int32_t> argmax_;       // [rows]
  // Sample over every row (greedy settings for rows not sampled).
  SampleRows sample_rows_;
  BackendBuffer probs_dev_;           // [rows, vocab] f32 processed distributions
  BackendBuffer sampled_dev_;         // [rows] i32
  std::vector<int32_t> sampled_;      // [rows]
  // VerifyDrafts over the sampled sequences with drafts (n of them, k slots each).
  int32_t spec_k_ = 0;
  std::vector<int32_t> num_drafts_, drafts_, target_row_, draft_row_;  // [n], [n, k], [n], [n]
  std::vector<float> accept_draws_, final_draws_;                      // [n, k], [n]
  std::vector<float> draft_probs_;  // [sum of drafts, vocab] q gathered on the host
  BackendBuffer num_drafts_dev_, drafts_dev_, target_row_dev_, draft_row_dev_, accept_dev_, final_dev_,
      draft_probs_dev_, verified_dev_, num_accepted_dev_;
  std::vector<int32_t> verified_, num_accepted_;  // [n, k + 1], [n]
  // Rows of host-routed sequences, back on the host.
  std::vector<std::vector<float>> host_rows_;  // [seqs][(k + 1) * vocab]
};

}  // namespace specula

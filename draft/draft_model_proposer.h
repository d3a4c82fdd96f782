// A second, smaller model drafts k tokens autoregressively for all speculating sequences at once,
// recording its distributions q. It keeps its own paged KV cache per sequence; its watermark is
// moved back together with the target's, so no KV is copied. A sequence whose draft state cannot
// fit (pool full, or past the draft's context) simply gets no drafts that step.
#pragma once

#include <memory>
#include <random>

#include "draft/proposer.h"
#include "kernels/sample_args.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"

namespace specula {

class DraftModelProposer : public Proposer {
 public:
  // `draft` must outlive the proposer. `num_blocks` of `block_size` slots for the draft's KV.
  DraftModelProposer(LlamaModel* draft, int32_t block_size, int32_t num_blocks);
  // The same, owning its draft model (draft/factory.h).
  DraftModelProposer(std::unique_ptr<LlamaModel> draft, int32_t block_size, int32_t num_blocks)
      : DraftModelProposer(draft.get(), block_size, num_blocks) {
    owned_ = std::move(draft);
  }

  absl::Status Propose(absl::Span<const ProposeInput> inputs, std::vector<Proposal>* out) override;
  void Rollback(ProposerState* state, int32_t num_valid) override;
  int32_t blocks_in_use() const override { return kv_.num_blocks() - allocator_.num_free(); }
  const ModelConfig* model_config() const override { return &draft_->config(); }
  absl::StatusOr<std::vector<CostPoint>> MeasureCost(const CostGrid& grid) override;
  int32_t CatchUpTokens(const ProposerState* state, int32_t len) const override;
  // Drafts are chosen where the draft's logits are when its backend is a device: greedy ones by its
  // backend's Argmax, sampled ones by its Sample, whose distributions q stay there
  // (Proposal::backend_probs); only the ids come back. A step with a row whose sampling the backend
  // does not do (repetition penalty, min-p), or a constrained row (masked by its grammar, so that q
  // is the masked q), is chosen on the host. Tests turn it on for the CPU backend too.
  void set_choose_on_backend(bool on) { choose_on_backend_ = on; }

 private:
  struct SeqState : ProposerState {  // a request's draft KV (its blocks go back with it) and stream
    std::unique_ptr<SequenceBlocks> blocks;
    int32_t computed = 0;  // tokens with draft KV
    std::mt19937_64 rng;
  };
  // A sequence still drafting: its input's index, its state, its tokens plus the drafts so far.
  struct Active {
    size_t index;
    SeqState* state;
    std::vector<TokenId> tokens;
  };

  // One draft token for row `row_index` of logits_ on the host (sampled ones record their q in p).
  TokenId Choose(size_t row_index, int32_t vocab, const ProposeInput& in, absl::Span<const TokenId> tokens,
                 std::mt19937_64& rng, Proposal* p);
  // chosen_[rows] from the draft's last logits, left in its backend: each row's argmax, or its
  // sample (with q written to q_dev_, at row index * k_max + its drafts so far) when `sampled`.
  absl::Status ChooseOnBackend(absl::Span<Active> active, absl::Span<const ProposeInput> inputs,
                               const std::vector<Proposal>& out, bool sampled, int32_t k_max, int32_t vocab);

  std::unique_ptr<LlamaModel> owned_;  // null when the caller owns the draft model
  LlamaModel* draft_;
  KvCache kv_;
  BlockAllocator allocator_;
  std::vector<float> logits_;  // [num_seqs, vocab]
  std::vector<float> probs_;   // [vocab]
  bool choose_on_backend_;
  BackendBuffer chosen_dev_;       // [num_seqs] i32
  std::vector<TokenId> chosen_;    // [num_seqs]
  SampleRows sample_rows_;  // Sample's per-row arguments
  BackendBuffer q_dev_;     // [inputs * k_max, vocab] f32 the step's q
};

}  // namespace specula

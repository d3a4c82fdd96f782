// A second, smaller model drafts k tokens autoregressively for all speculating sequences at once,
// recording its distributions q. It keeps its own paged KV cache per sequence; its watermark is
// moved back together with the target's, so no KV is copied. A sequence whose draft state cannot
// fit (pool full, or past the draft's context) simply gets no drafts that step.
#pragma once

#include <memory>
#include <random>
#include <unordered_map>

#include "draft/proposer.h"
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
  void Rollback(RequestId id, int32_t num_valid) override;
  void Release(RequestId id) override;
  int32_t blocks_in_use() const override { return kv_.num_blocks() - allocator_.num_free(); }
  const ModelConfig* model_config() const override { return &draft_->config(); }
  absl::StatusOr<std::vector<CostPoint>> MeasureCost(const CostGrid& grid) override;
  int32_t CatchUpTokens(RequestId id, int32_t len) const override;
  // Greedy drafts are chosen where the draft's logits are (its backend's Argmax; only the ids come
  // back) when its backend is a device; tests turn it on for the CPU backend too.
  void set_argmax_on_backend(bool on) { argmax_on_backend_ = on; }

 private:
  struct SeqState {
    std::unique_ptr<SequenceBlocks> blocks;
    int32_t computed = 0;  // tokens with draft KV
    std::mt19937_64 rng;
  };

  std::unique_ptr<LlamaModel> owned_;  // null when the caller owns the draft model
  LlamaModel* draft_;
  KvCache kv_;
  BlockAllocator allocator_;
  std::unordered_map<RequestId, SeqState> seqs_;
  // One draft token for row `row_index` of logits_ on the host (sampled ones record their q in p).
  TokenId Choose(size_t row_index, int32_t vocab, const ProposeInput& in, absl::Span<const TokenId> tokens,
                 std::mt19937_64& rng, Proposal* p);
  // argmax_[rows] from the draft's last logits, left in its backend.
  absl::Status ArgmaxOnBackend(int32_t rows, int32_t vocab);

  std::vector<float> logits_;  // [num_seqs, vocab]
  std::vector<float> probs_;   // [vocab]
  bool argmax_on_backend_;
  BackendBuffer argmax_dev_;       // [num_seqs] i32
  std::vector<TokenId> argmax_;    // [num_seqs]
};

}  // namespace specula

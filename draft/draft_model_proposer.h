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
  std::vector<float> logits_;  // [num_seqs, vocab]
  std::vector<float> probs_;   // [vocab]
};

}  // namespace specula

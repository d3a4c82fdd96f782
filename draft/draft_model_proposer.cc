#include "draft/draft_model_proposer.h"

#include <algorithm>

#include "core/categorical.h"

namespace specula {

DraftModelProposer::DraftModelProposer(LlamaModel* draft, int32_t block_size, int32_t num_blocks)
    : draft_(draft), kv_(draft->config(), {block_size, num_blocks, draft->kv_dtype()}, &draft->backend()), allocator_(kv_.num_blocks()) {}

absl::Status DraftModelProposer::Propose(absl::Span<const ProposeInput> inputs, std::vector<Proposal>* out) {
  out->assign(inputs.size(), Proposal{});
  const int32_t vocab = draft_->config().vocab_size;
  // Working copy of each active sequence: its tokens plus the drafts so far.
  struct Active {
    size_t index;
    SeqState* state;
    std::vector<TokenId> tokens;
  };
  std::vector<Active> active;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ProposeInput& in = inputs[i];
    const int32_t len = static_cast<int32_t>(in.tokens.size());
    if (in.k <= 0 || len + in.k - 1 > draft_->config().max_seq_len) continue;
    auto [it, inserted] = seqs_.try_emplace(in.id);
    if (inserted) {
      it->second.rng.seed(in.sampling->seed ^ 0x5eedd1a7ull);
      it->second.blocks = std::make_unique<SequenceBlocks>(&allocator_, kv_.block_size());
    }
    SeqState& st = it->second;
    st.computed = std::min(st.computed, len - 1);  // re-run at least the last token for its logits
    // Slots for the catch-up and the k - 1 drafts that are run through the draft model.
    if (!st.blocks->Reserve(len + in.k - 1).ok()) continue;
    active.push_back({i, &st, std::vector<TokenId>(in.tokens.begin(), in.tokens.end())});
  }
  for (int32_t step = 0; !active.empty(); ++step) {
    ForwardBatch batch;
    for (Active& a : active) {
      const int32_t len = static_cast<int32_t>(a.tokens.size());
      batch.seqs.push_back({absl::MakeConstSpan(a.tokens).subspan(a.state->computed, len - a.state->computed),
                            a.state->computed, a.state->blocks->table()});
    }
    if (auto st = draft_->Forward(batch, kv_, LogitsMode::kLastPerSequence, &logits_); !st.ok()) return st;
    std::vector<Active> next;
    for (size_t j = 0; j < active.size(); ++j) {
      Active& a = active[j];
      const ProposeInput& in = inputs[a.index];
      Proposal& p = (*out)[a.index];
      a.state->computed = static_cast<int32_t>(a.tokens.size());
      const absl::Span<const float> row = absl::MakeConstSpan(logits_).subspan(j * vocab, vocab);
      TokenId d;
      if (in.sampling->temperature == 0.0f && in.sampling->repetition_penalty == 1.0f) {
        // Greedy without a penalty: the argmax that the one-hot distribution would give, without its
        // three passes over the vocabulary (a tenth of a 1-token forward of a small draft at 32,000).
        d = static_cast<TokenId>(Argmax(row));
      } else {
        SamplingProbabilities(*in.sampling, row, a.tokens, &probs_);
        if (in.sampling->temperature == 0.0f) {
          d = static_cast<TokenId>(Argmax(probs_));  // the penalized argmax's one-hot
        } else {
          d = SampleCategorical(probs_, std::uniform_real_distribution<double>(0.0, 1.0)(a.state->rng));
          p.probs.insert(p.probs.end(), probs_.begin(), probs_.end());
        }
      }
      p.tokens.push_back(d);
      a.tokens.push_back(d);
      if (static_cast<int32_t>(p.tokens.size()) < in.k) next.push_back(std::move(a));
    }
    active = std::move(next);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CostPoint>> DraftModelProposer::MeasureCost(const CostGrid& grid) {
  return MeasureForwardCost(*draft_, grid);
}

int32_t DraftModelProposer::CatchUpTokens(RequestId id, int32_t len) const {
  auto it = seqs_.find(id);
  return len - (it == seqs_.end() ? 0 : std::min(it->second.computed, len - 1));
}

void DraftModelProposer::Rollback(RequestId id, int32_t num_valid) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  it->second.computed = std::min(it->second.computed, num_valid);
  it->second.blocks->Truncate(it->second.computed);
}

void DraftModelProposer::Release(RequestId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  seqs_.erase(it);  // SequenceBlocks gives its blocks back
}

}  // namespace specula

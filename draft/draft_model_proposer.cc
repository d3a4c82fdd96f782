#include "draft/draft_model_proposer.h"

#include <algorithm>

#include "core/categorical.h"
#include "core/status_macros.h"

namespace specula {

DraftModelProposer::DraftModelProposer(LlamaModel* draft, int32_t block_size, int32_t num_blocks)
    : draft_(draft), kv_(draft->config(), {block_size, num_blocks, draft->kv_dtype()}, &draft->backend()), allocator_(kv_.num_blocks()),
      argmax_on_backend_(draft->backend().on_device()) {}

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
    bool greedy = true;  // every row's draft is its argmax: chosen where the logits are
    for (Active& a : active) {
      const int32_t len = static_cast<int32_t>(a.tokens.size());
      batch.seqs.push_back({absl::MakeConstSpan(a.tokens).subspan(a.state->computed, len - a.state->computed),
                            a.state->computed, a.state->blocks->table()});
      const SamplingParams& sp = *inputs[a.index].sampling;
      greedy = greedy && sp.temperature == 0.0f && sp.repetition_penalty == 1.0f;
    }
    const bool on_backend = greedy && argmax_on_backend_ && draft_->logits_stay_in_backend();
    RETURN_IF_ERROR(draft_->Forward(batch, kv_, LogitsMode::kLastPerSequence, on_backend ? nullptr : &logits_));
    if (on_backend) RETURN_IF_ERROR(ArgmaxOnBackend(static_cast<int32_t>(active.size()), vocab));
    std::vector<Active> next;
    for (size_t j = 0; j < active.size(); ++j) {
      Active& a = active[j];
      const ProposeInput& in = inputs[a.index];
      Proposal& p = (*out)[a.index];
      a.state->computed = static_cast<int32_t>(a.tokens.size());
      const TokenId d = on_backend ? argmax_[j] : Choose(j, vocab, in, a.tokens, a.state->rng, &p);
      p.tokens.push_back(d);
      a.tokens.push_back(d);
      if (static_cast<int32_t>(p.tokens.size()) < in.k) next.push_back(std::move(a));
    }
    active = std::move(next);
  }
  return absl::OkStatus();
}

TokenId DraftModelProposer::Choose(size_t row_index, int32_t vocab, const ProposeInput& in,
                                   absl::Span<const TokenId> tokens, std::mt19937_64& rng, Proposal* p) {
  const absl::Span<const float> row = absl::MakeConstSpan(logits_).subspan(row_index * vocab, vocab);
  if (in.sampling->temperature == 0.0f && in.sampling->repetition_penalty == 1.0f) {
    // Greedy without a penalty: the argmax that the one-hot distribution would give, without its
    // three passes over the vocabulary (a tenth of a 1-token forward of a small draft at 32,000).
    return static_cast<TokenId>(Argmax(row));
  }
  SamplingProbabilities(*in.sampling, row, tokens, &probs_);
  if (in.sampling->temperature == 0.0f) return static_cast<TokenId>(Argmax(probs_));  // the penalized argmax's one-hot
  const TokenId d = SampleCategorical(probs_, std::uniform_real_distribution<double>(0.0, 1.0)(rng));
  p->probs.insert(p->probs.end(), probs_.begin(), probs_.end());
  return d;
}

absl::Status DraftModelProposer::ArgmaxOnBackend(int32_t rows, int32_t vocab) {
  Backend& be = draft_->backend();
  RETURN_IF_ERROR(argmax_dev_.Grow(&be, rows * sizeof(int32_t)));
  argmax_.resize(rows);
  be.Argmax(draft_->backend_logits(), rows, vocab, argmax_dev_.as<int32_t>());
  be.CopyOut(argmax_.data(), argmax_dev_.get(), rows * sizeof(int32_t));
  return be.Sync();
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

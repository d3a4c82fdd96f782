#include "draft/draft_model_proposer.h"

#include <algorithm>

#include "core/categorical.h"
#include "core/status_macros.h"

namespace specula {

DraftModelProposer::DraftModelProposer(LlamaModel* draft, int32_t block_size, int32_t num_blocks)
    : draft_(draft), kv_(draft->config(), {block_size, num_blocks, draft->kv_dtype()}, &draft->backend()), allocator_(kv_.num_blocks()),
      choose_on_backend_(draft->backend().on_device()) {}

absl::Status DraftModelProposer::Propose(absl::Span<const ProposeInput> inputs, std::vector<Proposal>* out) {
  out->assign(inputs.size(), Proposal{});
  const int32_t vocab = draft_->config().vocab_size;
  std::vector<Active> active;
  int32_t k_max = 0;
  bool on_backend = choose_on_backend_ && draft_->logits_stay_in_backend(), sampled = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ProposeInput& in = inputs[i];
    const int32_t len = static_cast<int32_t>(in.tokens.size());
    if (in.k <= 0 || len + in.k - 1 > draft_->config().max_seq_len) continue;
    if (*in.state == nullptr) {
      auto fresh = std::make_unique<SeqState>();
      fresh->rng.seed(in.sampling->seed ^ 0x5eedd1a7ull);
      fresh->blocks = std::make_unique<SequenceBlocks>(&allocator_, kv_.block_size());
      *in.state = std::move(fresh);
    }
    SeqState& st = static_cast<SeqState&>(**in.state);
    st.computed = std::min(st.computed, len - 1);  // re-run at least the last token for its logits
    // Slots for the catch-up and the k - 1 drafts that are run through the draft model.
    if (!st.blocks->Reserve(len + in.k - 1).ok()) continue;
    active.push_back({i, &st, std::vector<TokenId>(in.tokens.begin(), in.tokens.end())});
    k_max = std::max(k_max, in.k);
    // A constrained row is masked on the host before its draft is chosen.
    on_backend = on_backend && Sampler::BackendCanSample(*in.sampling) && in.grammar == nullptr;
    sampled = sampled || in.sampling->temperature > 0.0f;
  }
  if (on_backend && sampled) {
    RETURN_IF_ERROR(q_dev_.Grow(&draft_->backend(), inputs.size() * k_max * static_cast<size_t>(vocab) * sizeof(float)));
  }
  while (!active.empty()) {
    ForwardBatch batch;
    for (Active& a : active) {
      const int32_t len = static_cast<int32_t>(a.tokens.size());
      batch.seqs.push_back({absl::MakeConstSpan(a.tokens).subspan(a.state->computed, len - a.state->computed),
                            a.state->computed, a.state->blocks->table()});
    }
    RETURN_IF_ERROR(draft_->Forward(batch, kv_, LogitsMode::kLastPerSequence, on_backend ? nullptr : &logits_));
    if (on_backend) RETURN_IF_ERROR(ChooseOnBackend(absl::MakeSpan(active), inputs, *out, sampled, k_max, vocab));
    std::vector<Active> next;
    for (size_t j = 0; j < active.size(); ++j) {
      Active& a = active[j];
      const ProposeInput& in = inputs[a.index];
      Proposal& p = (*out)[a.index];
      a.state->computed = static_cast<int32_t>(a.tokens.size());
      const TokenId d = on_backend ? chosen_[j] : Choose(j, vocab, in, a.tokens, a.state->rng, &p);
      if (on_backend && in.sampling->temperature > 0.0f) {
        p.backend_probs = q_dev_.as<float>() + a.index * k_max * static_cast<size_t>(vocab);
        p.probs_backend = &draft_->backend();
      }
      p.tokens.push_back(d);
      a.tokens.push_back(d);
      const bool more = in.grammar == nullptr || in.grammar->Advance(d);  // a draft that ends the grammar is the last
      if (more && static_cast<int32_t>(p.tokens.size()) < in.k) next.push_back(std::move(a));
    }
    active = std::move(next);
  }
  return absl::OkStatus();
}

TokenId DraftModelProposer::Choose(size_t row_index, int32_t vocab, const ProposeInput& in,
                                   absl::Span<const TokenId> tokens, std::mt19937_64& rng, Proposal* p) {
  const absl::Span<float> row = absl::MakeSpan(logits_).subspan(row_index * vocab, vocab);
  if (in.grammar != nullptr) in.grammar->Mask(row);  // q is the masked q
  if (in.sampling->temperature == 0.0f && !in.sampling->ProcessesLogits()) {
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

absl::Status DraftModelProposer::ChooseOnBackend(absl::Span<Active> active, absl::Span<const ProposeInput> inputs,
                                                 const std::vector<Proposal>& out, bool sampled, int32_t k_max,
                                                 int32_t vocab) {
  Backend& be = draft_->backend();
  const int32_t rows = static_cast<int32_t>(active.size());
  RETURN_IF_ERROR(chosen_dev_.Grow(&be, rows * sizeof(int32_t)));
  chosen_.resize(rows);
  if (!sampled) {
    be.Argmax(draft_->backend_logits(), rows, vocab, chosen_dev_.as<int32_t>());
  } else {
    // Greedy rows among sampled ones go through Sample at temperature 0 (their q rows unused). A
    // sampled row takes its sequence's next draw, as the host's path does.
    sample_rows_.Reset(rows);
    for (int32_t r = 0; r < rows; ++r) {
      const SamplingParams& sp = *inputs[active[r].index].sampling;
      sample_rows_.Set(r, sp.temperature, sp.top_k, sp.top_p);
      if (sp.temperature > 0.0f) sample_rows_.SetDraw(r, std::uniform_real_distribution<double>(0.0, 1.0)(active[r].state->rng));
      sample_rows_.SetProbsRow(r, static_cast<int32_t>(active[r].index * k_max + out[active[r].index].tokens.size()));
    }
    ASSIGN_OR_RETURN(const SampleArgs args, sample_rows_.Upload(&be));
    be.Sample(draft_->backend_logits(), rows, vocab, args, q_dev_.as<float>(), chosen_dev_.as<int32_t>());
  }
  be.CopyOut(chosen_.data(), chosen_dev_.get(), rows * sizeof(int32_t));
  return be.Sync();
}

absl::StatusOr<std::vector<CostPoint>> DraftModelProposer::MeasureCost(const CostGrid& grid) {
  return MeasureForwardCost(*draft_, grid);
}

int32_t DraftModelProposer::CatchUpTokens(const ProposerState* state, int32_t len) const {
  const auto* st = static_cast<const SeqState*>(state);
  return len - (st == nullptr ? 0 : std::min(st->computed, len - 1));
}

void DraftModelProposer::Rollback(ProposerState* state, int32_t num_valid) {
  if (state == nullptr) return;
  auto& st = static_cast<SeqState&>(*state);
  st.computed = std::min(st.computed, num_valid);
  st.blocks->Truncate(st.computed);
}

}  // namespace specula

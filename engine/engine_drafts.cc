// The step's drafts and structured output's part in them (Engine::Propose, ConstrainLogits,
// FollowConstraints): a constrained sequence's drafts start with the tokens its grammar forces, its
// proposer continues after them under the grammar, a draft that leaves the grammar is cut there,
// and every row the target verifies is masked by the grammar at that row's position. Between these
// stages a request's matcher is where its accepted tokens put it; each stage that advances it over
// drafts rolls it back before returning.
#include <limits>

#include "core/status_macros.h"
#include "engine/engine.h"

namespace specula {
namespace {

// A request's matcher as the grammar of its proposer's drafts (draft/proposer.h), from where the
// forced drafts left it; Undo takes back what the proposer advanced.
class MatcherGrammar final : public DraftGrammar {
 public:
  MatcherGrammar(ConstraintMatcher* matcher, int32_t vocab)
      : matcher_(matcher), vocab_(vocab), mask_(MaskWords(vocab)) {}

  void Mask(absl::Span<float> logits) override {
    matcher_->FillMask(absl::MakeSpan(mask_));
    const size_t known = std::min(logits.size(), static_cast<size_t>(vocab_));
    ApplyMask(mask_, logits.first(known));
    // A draft vocabulary larger than the target's: its extra ids are never the target's tokens.
    std::fill(logits.begin() + known, logits.end(), -std::numeric_limits<float>::infinity());
  }
  bool Advance(TokenId token) override {
    if (matcher_->terminated() || !matcher_->Accept(token)) return false;
    ++advanced_;
    return !matcher_->terminated();
  }
  void Undo() {
    matcher_->Rollback(advanced_);
    advanced_ = 0;
  }

 private:
  ConstraintMatcher* matcher_;
  const int32_t vocab_;
  int32_t advanced_ = 0;
  std::vector<uint32_t> mask_;  // [MaskWords(vocab)]
};

// Advances `m` over `tokens` while it accepts them and has not ended; returns how many it took.
int32_t AcceptWhileAllowed(ConstraintMatcher& m, absl::Span<const TokenId> tokens) {
  int32_t taken = 0;
  for (TokenId t : tokens) {
    if (m.terminated() || !m.Accept(t)) break;
    ++taken;
  }
  return taken;
}

// A proposal after the forced drafts in `p`: an unconstrained request's as it came; a constrained
// one's cut where the grammar refuses a draft or after one that ends it, and q one-hot for the
// forced drafts where the proposer gave q. `m` is past the forced drafts, and stays there.
void MergeProposal(ConstraintMatcher* m, Proposal proposed, size_t vocab, Proposal* p, int32_t* cut) {
  if (m == nullptr) {
    *p = std::move(proposed);
    return;
  }
  const int32_t kept = AcceptWhileAllowed(*m, proposed.tokens);
  m->Rollback(kept);
  *cut = static_cast<int32_t>(proposed.tokens.size()) - kept;
  const size_t f = p->tokens.size();
  if (!proposed.probs.empty()) {
    p->probs.assign(f * vocab, 0.0f);
    for (size_t t = 0; t < f; ++t) p->probs[t * vocab + p->tokens[t]] = 1.0f;
    p->probs.insert(p->probs.end(), proposed.probs.begin(), proposed.probs.begin() + kept * vocab);
  }
  p->tokens.insert(p->tokens.end(), proposed.tokens.begin(), proposed.tokens.begin() + kept);
}

}  // namespace

Engine::Drafts Engine::Propose(const StepPlan& plan) {
  Drafts d;
  d.index.assign(plan.seqs.size(), SIZE_MAX);
  std::vector<ProposeInput> inputs;           // [asked]
  std::vector<size_t> asked;                  // [asked]: the proposal each input fills
  std::vector<RequestRecord*> asked_records;  // [asked]
  std::vector<std::vector<TokenId>> extended;  // [asked]: a sequence with its forced drafts (the inputs' spans)
  std::vector<std::unique_ptr<MatcherGrammar>> grammars;  // [asked]: null for unconstrained requests
  extended.reserve(plan.seqs.size());
  const int32_t vocab = model_->config().vocab_size;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (s.num_spec == 0) continue;
    RequestRecord& r = RecordOf(s);
    Proposal forced;
    if (r.matcher.has_value()) {
      const size_t n = std::min<size_t>(r.forced.size(), s.num_spec);
      const int32_t f = AcceptWhileAllowed(*r.matcher, absl::MakeConstSpan(r.forced).first(n));
      forced.tokens.assign(r.forced.begin(), r.forced.begin() + f);
    }
    d.index[i] = d.proposals.size();
    d.forced.push_back(static_cast<int32_t>(forced.tokens.size()));
    d.cut.push_back(0);
    const int32_t k = s.num_spec - d.forced.back();
    const bool ended = r.matcher.has_value() && r.matcher->terminated();
    if (spec_.proposer != nullptr && k > 0 && !ended) {
      asked.push_back(d.proposals.size());
      asked_records.push_back(&r);
      grammars.push_back(r.matcher.has_value() ? std::make_unique<MatcherGrammar>(&*r.matcher, vocab) : nullptr);
      absl::Span<const TokenId> tokens = r.tokens;
      if (!forced.tokens.empty()) {
        extended.emplace_back(r.tokens.begin(), r.tokens.end());
        extended.back().insert(extended.back().end(), forced.tokens.begin(), forced.tokens.end());
        tokens = extended.back();
      }
      inputs.push_back({s.id, &r.proposer, tokens, k, &r.request.sampling, d.forced.back(), grammars.back().get()});
    }
    d.proposals.push_back(std::move(forced));
  }
  if (!inputs.empty()) {
    const double t0 = clock_->NowSeconds();
    std::vector<Proposal> out;
    // A failed proposer degrades to the forced drafts alone.
    if (!spec_.proposer->Propose(inputs, &out).ok()) out.assign(inputs.size(), Proposal{});
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (grammars[j] != nullptr) grammars[j]->Undo();
      ConstraintMatcher* m = asked_records[j]->matcher.has_value() ? &*asked_records[j]->matcher : nullptr;
      MergeProposal(m, std::move(out[j]), vocab, &d.proposals[asked[j]], &d.cut[asked[j]]);
    }
    d.seconds = clock_->NowSeconds() - t0;
  }
  // Each matcher back where its accepted tokens put it.
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (d.index[i] == SIZE_MAX) continue;
    RequestRecord& r = RecordOf(plan.seqs[i]);
    if (r.matcher.has_value()) r.matcher->Rollback(d.forced[d.index[i]]);
  }
  return d;
}

absl::StatusOr<absl::Span<float>> Engine::MaskableRows(size_t i, size_t n, Ran* ran) {
  const size_t vocab = model_->config().vocab_size;
  const size_t first = ran->row_of[i];
  if (!verifier_.on_backend()) return absl::MakeSpan(ran->logits).subspan(first * vocab, n * vocab);
  // On a device the sequence's rows come to the host, where the verifier takes them (its host route).
  if (ran->masked_row.empty()) ran->masked_row.assign(static_cast<size_t>(ran->timing.rows), -1);
  const size_t at = ran->masked.size() / vocab;
  ran->masked.resize((at + n) * vocab);
  Backend& be = model_->backend();
  be.CopyOut(ran->masked.data() + at * vocab, model_->backend_logits() + first * vocab, n * vocab * sizeof(float));
  RETURN_IF_ERROR(be.Sync());
  for (size_t j = 0; j < n; ++j) ran->masked_row[first + j] = static_cast<int32_t>(at + j);
  return absl::MakeSpan(ran->masked).subspan(at * vocab, n * vocab);
}

absl::Status Engine::ConstrainLogits(const StepPlan& plan, const Drafts& drafts, Ran* ran) {
  const int32_t vocab = model_->config().vocab_size;
  const double t0 = clock_->NowSeconds();
  int64_t rows = 0;
  mask_.resize(MaskWords(vocab));
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    RequestRecord& r = RecordOf(s);
    if (!s.samples || !r.matcher.has_value()) continue;
    absl::Span<const TokenId> drafted;
    if (drafts.index[i] != SIZE_MAX) drafted = drafts.proposals[drafts.index[i]].tokens;
    ASSIGN_OR_RETURN(const absl::Span<float> logits, MaskableRows(i, drafted.size() + 1, ran));
    // Row j's mask is the grammar's after the first j drafts: advance over them, then fill the rows
    // from the last back, rolling back one draft at a time.
    const int32_t n = AcceptWhileAllowed(*r.matcher, drafted);
    for (int32_t j = n; j >= 0; --j) {
      if (!r.matcher->terminated()) {  // a row after a stop token chooses nothing that is kept
        r.matcher->FillMask(absl::MakeSpan(mask_));
        ApplyMask(mask_, logits.subspan(static_cast<size_t>(j) * vocab, vocab));
        ++rows;
      }
      if (j > 0) r.matcher->Rollback(1);
    }
  }
  if (rows == 0) return absl::OkStatus();
  stats_.constrained_rows += rows;
  stats_.constraint_mask_seconds += clock_->NowSeconds() - t0;
  return absl::OkStatus();
}

void Engine::FollowConstraints(const StepPlan& plan, const StepResult& result) {
  size_t out = 0;  // the sequence's place in result.outputs
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.samples) continue;
    const std::vector<TokenId>& tokens = result.outputs[out++].new_tokens;
    RequestRecord& r = RecordOf(s);
    if (!r.matcher.has_value()) continue;
    for (TokenId t : tokens) {
      if (r.matcher->terminated()) break;
      // A masked row only chooses allowed tokens; a refused one is a bug in the mask's path, and
      // ends the request rather than letting it leave its constraint.
      if (!r.matcher->Accept(t)) {
        if (r.status != SeqStatus::kFinished) scheduler_.Finish(&r, FinishReason::kError);
        break;
      }
    }
    r.forced.clear();
    if (r.status != SeqStatus::kFinished) r.forced = r.matcher->ForcedTokens(spec_.grammar_drafts);
  }
}

}  // namespace specula

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

}  // namespace

// A constrained sequence's drafts: the proposer's, cut at the grammar; where it has none, the
// tokens the grammar forces. A proposer's match repeats the model's own tokens (suffix, n-gram) or
// mimics them (a draft model), so it is accepted more often than the grammar's longest-match split
// of the same string: forced drafts first, or after the proposer's, made steps slower on the FAQ
// workload (docs/structured_output.md).
Engine::Drafts Engine::Propose(const StepPlan& plan) {
  Drafts d;
  d.index.assign(plan.seqs.size(), SIZE_MAX);
  std::vector<ProposeInput> inputs;                       // [asked]
  std::vector<size_t> asked;                              // [asked]: the proposal each input fills
  std::vector<std::unique_ptr<MatcherGrammar>> grammars;  // [asked]: null for unconstrained requests
  const int32_t vocab = model_->config().vocab_size;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (s.num_spec == 0) continue;
    RequestRecord& r = RecordOf(s);
    d.index[i] = d.proposals.size();
    d.proposals.emplace_back();
    d.forced.push_back(0);
    d.cut.push_back(0);
    const bool ended = r.matcher.has_value() && r.matcher->terminated();
    if (spec_.proposer == nullptr || ended) continue;
    // Its own k: the slots past it are for the grammar's forced drafts, should it have none.
    const int32_t k = std::min(s.num_spec, scheduler_.config().num_spec_tokens);
    if (k == 0) continue;
    asked.push_back(d.index[i]);
    grammars.push_back(r.matcher.has_value() ? std::make_unique<MatcherGrammar>(&*r.matcher, vocab) : nullptr);
    inputs.push_back({s.id, &r.proposer, r.tokens, k, &r.request.sampling, grammars.back().get()});
  }
  if (!inputs.empty()) {
    const double t0 = clock_->NowSeconds();
    std::vector<Proposal> out;
    // A failed proposer degrades to the forced drafts alone.
    if (!spec_.proposer->Propose(inputs, &out).ok()) out.assign(inputs.size(), Proposal{});
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (grammars[j] != nullptr) grammars[j]->Undo();
      d.proposals[asked[j]] = std::move(out[j]);
    }
    d.seconds = clock_->NowSeconds() - t0;
  }
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    RequestRecord& r = RecordOf(plan.seqs[i]);
    if (d.index[i] != SIZE_MAX && r.matcher.has_value()) AddForcedDrafts(r, plan.seqs[i].num_spec, d.index[i], &d);
  }
  return d;
}

void Engine::AddForcedDrafts(RequestRecord& r, int32_t slots, size_t at, Drafts* d) {
  ConstraintMatcher& m = *r.matcher;
  Proposal& p = d->proposals[at];
  const int32_t kept = AcceptWhileAllowed(m, p.tokens);
  d->cut[at] = static_cast<int32_t>(p.tokens.size()) - kept;
  p.tokens.resize(kept);
  if (!p.probs.empty()) p.probs.resize(kept * static_cast<size_t>(model_->config().vocab_size));  // [kept, vocab]
  int32_t f = 0;
  if (kept == 0 && !m.terminated()) {  // r.forced starts where the accepted tokens put the matcher
    const auto forced = absl::MakeConstSpan(r.forced).first(std::min<size_t>(r.forced.size(), slots));
    f = AcceptWhileAllowed(m, forced);
    p.tokens.assign(forced.begin(), forced.begin() + f);  // one-hot: no q
  }
  d->forced[at] = f;
  m.Rollback(kept + f);  // back where the accepted tokens put it
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
    if (r.status != SeqStatus::kFinished) r.forced = ForcedDrafts(r);
  }
}

std::vector<TokenId> Engine::ForcedDrafts(RequestRecord& r) const {
  // The grammar's split of what it forces, re-spelled as the model was seen to split it; where a
  // re-spelled token ends inside one of the split's, the grammar splits the rest afresh from there.
  // Greedy requests only: their output is the target's whatever the drafts, while a sampled one's
  // draws follow its drafts, which then depend on its own tokens alone (a seeded request repeats).
  ConstraintMatcher& m = *r.matcher;
  if (r.request.sampling.temperature != 0.0f) return m.ForcedTokens(spec_.grammar_drafts);
  std::vector<TokenId> out;
  while (static_cast<int32_t>(out.size()) < spec_.grammar_drafts) {
    const std::vector<TokenId> split = m.ForcedTokens(spec_.grammar_drafts - static_cast<int32_t>(out.size()));
    if (split.empty()) break;
    const std::vector<TokenId> spelled = spellings_.Spell(split);
    const int32_t taken = AcceptWhileAllowed(m, spelled);
    out.insert(out.end(), spelled.begin(), spelled.begin() + taken);
    if (taken == 0 || spelled == split) break;  // the whole forced string, or nothing more to take
  }
  m.Rollback(static_cast<int32_t>(out.size()));
  if (static_cast<int32_t>(out.size()) > spec_.grammar_drafts) out.resize(spec_.grammar_drafts);
  return out;
}

}  // namespace specula

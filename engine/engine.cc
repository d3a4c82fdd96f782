#include "engine/engine.h"

#include <omp.h>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/logprobs.h"
#include "model/forward_cost.h"

namespace specula {
namespace {

// Where the step's tokens are chosen: the backend that keeps the logits, or null: the host.
Backend* VerifierBackend(LlamaModel* model, const SpecConfig& spec) {
  const bool on_backend = spec.verify_on == SpecConfig::VerifyOn::kBackend ||
                          (spec.verify_on == SpecConfig::VerifyOn::kAuto && model->backend().on_device());
  return on_backend && model->logits_stay_in_backend() ? &model->backend() : nullptr;
}

}  // namespace

Engine::Engine(LlamaModel* model, const Tokenizer* tokenizer, const SchedulerConfig& config, SpecConfig spec,
               Clock* clock)
    : model_(model), tokenizer_(tokenizer), scheduler_(config),
      kv_(model->config(), {config.block_size, config.num_blocks, model->kv_dtype()}, &model->backend()),
      outputs_(tokenizer), verifier_(VerifierBackend(model, spec), spec.synthetic_alpha), spellings_(tokenizer),
      spec_(spec),
      clock_(clock != nullptr ? clock : DefaultClock()), start_s_(clock_->NowSeconds()) {
  stats_.spec_k_histogram.assign(std::max(config.num_spec_tokens, 0) + 1, 0);
  if (!spec_.adaptive || spec_.proposer == nullptr || !model_->status().ok() || !kv_.status().ok()) return;
  AdaptiveConfig ac{config.max_num_seqs, config.block_size, config.num_spec_tokens, spec_.calibration_seconds,
                    spec_.target_cost, spec_.draft_cost, spec_.refine_cost, clock_};
  const ModelConfig* draft = spec_.proposer->model_config();
  auto s = AdaptiveSpeculation::Create(
      ac, ShapeOf(model_->config()), draft != nullptr ? std::optional(ShapeOf(*draft)) : std::nullopt,
      [this](const CostGrid& g) { return MeasureForwardCost(*model_, g); },
      [proposer = spec_.proposer](const CostGrid& g) { return proposer->MeasureCost(g); });
  if (!s.ok()) {
    calibration_ = s.status();
    return;
  }
  speculation_ = std::move(s).value();
  CopyCostStats();
  if (speculation_->drafts_cannot_pay()) {
    stats_.drafts_cannot_pay = true;
    scheduler_.StopSpeculation();  // the stats still count the plain decode steps (CountSpeculation)
  }
}

absl::Status Engine::Validate() const {
  if (!model_->status().ok()) return model_->status();
  if (!kv_.status().ok()) return kv_.status();
  if (!calibration_.ok()) return calibration_;
  if (spec_.verify_on == SpecConfig::VerifyOn::kBackend && !verifier_.on_backend()) {
    return absl::FailedPreconditionError("tokens cannot be chosen on a device under tensor parallelism");
  }
  if (spec_.adaptive && spec_.proposer == nullptr) {
    return absl::InvalidArgumentError("adaptive speculation needs a proposer");
  }
  if (spec_.synthetic_alpha >= 0 && !spec_.allow_synthetic) {
    return absl::FailedPreconditionError(
        "the synthetic proposer is not lossless: it is only available in benchmark and experiment modes");
  }
  if (spec_.synthetic_alpha > 1.0) return absl::InvalidArgumentError("synthetic acceptance rate must be in [0, 1]");
  if (scheduler_.config().num_spec_tokens > 0 && spec_.proposer == nullptr) {
    return absl::InvalidArgumentError("num_spec_tokens > 0 needs a proposer");
  }
  return absl::OkStatus();
}

void Engine::HandOffThreads() { omp_pause_resource_all(omp_pause_soft); }

void Engine::MeasureSpeculationCosts() {
  if (speculation_ == nullptr) return;
  speculation_->MeasureRemaining();
  CopyCostStats();
}

void Engine::CopyCostStats() {
  stats_.cost_measure_seconds = speculation_->measure_seconds();
  stats_.cost_measured_tokens = speculation_->measured_tokens();
}

double Engine::NowMs() const {
  return (clock_->NowSeconds() - start_s_) * 1000.0;
}


absl::StatusOr<std::shared_ptr<const CompiledConstraint>> Engine::CompileConstraint(const RequestSpec& spec) const {
  const std::string field = spec.constraint.field.empty() ? "constraint" : spec.constraint.field;
  if (tokenizer_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": structured output needs the model's tokenizer"));
  }
  std::call_once(constraints_once_, [this] {
    const std::vector<TokenId> stops = StopTokenIds(Request{}, model_->config(), tokenizer_);
    constraints_ = ConstraintCompiler::Create(MakeConstraintVocab(*tokenizer_, model_->config().vocab_size, stops));
  });
  return constraints_->Compile(spec.constraint);
}

absl::Status Engine::AddRequest(Request r) {
  if (records_.count(r.id)) return absl::AlreadyExistsError(absl::StrCat("request id ", r.id, " is already in use"));
  if (auto st = ValidateRequest(r, model_->config().vocab_size, tokenizer_ != nullptr); !st.ok()) return st;
  if (r.constraint.active() && r.compiled_constraint == nullptr) {
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> compiled = CompileConstraint(r);
    if (!compiled.ok()) return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": ", compiled.status().message()));
    r.compiled_constraint = *std::move(compiled);
  }
  const double now = NowMs();
  NewSequence n{r.id, r.prompt, r.max_tokens, StopTokenIds(r, model_->config(), tokenizer_), r.priority, now,
                r.prompt_logprobs >= 0, SaltRoot(r.cache_salt)};
  r.sampling.output_start = static_cast<int32_t>(r.prompt.size());  // penalties count the generated tokens
  const RequestId id = r.id;
  // The matcher keeps the compiled constraint; the record's request does not hold it twice.
  std::shared_ptr<const CompiledConstraint> compiled =
      r.constraint.active() ? std::move(r.compiled_constraint) : nullptr;
  auto record = std::make_unique<RequestRecord>(std::move(r), now);
  if (compiled != nullptr) {
    record->matcher.emplace(std::move(compiled), n.stop_ids);
    record->forced = ForcedDrafts(*record);
  }
  if (auto st = scheduler_.Check(n); !st.ok()) return st;
  if (!FetchFirst(*record, n)) RETURN_IF_ERROR(scheduler_.Add(std::move(n), record.get()));
  records_.emplace(id, std::move(record));
  return absl::OkStatus();
}

void Engine::Abort(RequestId id) {
  auto it = records_.find(id);
  if (it == records_.end() || it->second->aborted) return;
  RequestRecord& r = *it->second;
  scheduler_.Finish(&r, FinishReason::kAborted);
  const bool ran = !r.kv_store.admit.has_value();  // else it waited on a fetch, unseen by the scheduler
  if (spec_.proposer != nullptr && ran) spec_.proposer->Finished(r.proposer.get(), r.tokens, r.num_prompt);
  r.aborted = true;
  aborted_.push_back(id);
}

std::vector<RequestDelta> Engine::Step() {
  const double start = clock_->NowSeconds();
  InstallFetched();
  StepPlan plan = Schedule();
  if (plan.seqs.empty()) {
    // Nothing to run but store work: wait for it a little rather than spin.
    if (!store_.fetches.empty() || !store_.held.empty()) store_.transfer->Wait(2.0);
    return Publish({});
  }
  const std::vector<SpecCandidate> candidates = Candidates(plan);
  if (speculation_ != nullptr) speculation_->Choose(&plan, candidates);
  CountSpeculation(plan, candidates);
  const Drafts drafts = Propose(plan);
  absl::StatusOr<Ran> ran = Forward(plan, drafts);
  if (ran.ok()) {
    if (absl::Status masked = ConstrainLogits(plan, drafts, &*ran); !masked.ok()) ran = masked;
  }
  absl::StatusOr<Verified> verified = ran.ok() ? Verify(plan, drafts, *ran) : absl::StatusOr<Verified>(ran.status());
  if (!verified.ok()) return Publish(FailStep(plan, verified.status()));
  if (speculation_ != nullptr) {
    StepTiming timing = ran->timing;
    timing.seconds = clock_->NowSeconds() - start;
    speculation_->Observe(plan, candidates, verified->result, timing);
    CopyCostStats();
  }
  spare_logits_ = std::move(ran->logits);
  if (step_observer_) {
    const StepResult result = verified->result;  // Update takes the tokens
    StepOutputs out = Update(plan, *std::move(verified), drafts);
    step_observer_(plan, result, start);
    return Publish(std::move(out));
  }
  return Publish(Update(plan, *std::move(verified), drafts));
}

StepPlan Engine::Schedule() {
  const double now = NowMs();
  StepPlan plan = scheduler_.Schedule(now);
  if (plan.seqs.empty()) {
    if (plan.wait_ms > 0) clock_->SleepFor(std::min(plan.wait_ms, 5.0) / 1000.0);
    return plan;
  }
  ++stats_.steps;
  for (const ScheduledSeq& s : plan.seqs) {
    RequestOutput& out = RecordOf(s).output.out;
    if (out.scheduled_ms == 0) out.scheduled_ms = now;
  }
  if (spec_.proposer != nullptr) {
    for (RequestId id : plan.preempted) spec_.proposer->Preempted(records_.at(id)->proposer);
  }
  return plan;
}

std::vector<SpecCandidate> Engine::Candidates(const StepPlan& plan) const {
  std::vector<SpecCandidate> candidates;  // sequences the scheduler made room for drafts
  if (spec_.proposer == nullptr) return candidates;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (s.num_spec == 0) continue;
    RequestRecord& r = RecordOf(s);
    const int32_t len = static_cast<int32_t>(r.tokens.size());
    candidates.push_back({s.id, s.num_spec, len, spec_.proposer->CatchUpTokens(r.proposer.get(), len), i, &r.acceptance});
  }
  return candidates;
}

void Engine::CountSpeculation(const StepPlan& plan, absl::Span<const SpecCandidate> candidates) {
  if (spec_.proposer == nullptr) return;
  std::vector<int64_t>& histogram = stats_.spec_k_histogram;
  int64_t decoding = 0;
  bool any = false;
  if (stats_.drafts_cannot_pay) {  // the scheduler made no room for drafts: count the plain decodes
    for (const ScheduledSeq& s : plan.seqs) {
      const bool decodes = s.samples && s.num_tokens == 1 && s.start_pos >= s.seq->num_prompt;
      decoding += decodes ? 1 : 0;
    }
    histogram[0] += decoding;
  }
  for (const SpecCandidate& c : candidates) {
    const int32_t k = plan.seqs[c.plan_index].num_spec;
    ++histogram[std::min<size_t>(k, histogram.size() - 1)];
    ++decoding;
    any = any || k > 0;
  }
  if (decoding == 0) return;
  ++stats_.decode_steps;
  if (!any) ++stats_.spec_off_steps;
}

absl::StatusOr<Engine::Ran> Engine::Forward(const StepPlan& plan, const Drafts& drafts) {
  ForwardBatch batch;
  Ran ran;
  ran.row_of.resize(plan.seqs.size());
  ran.prompt_row.assign(plan.seqs.size(), -1);
  size_t num_fed = 0;
  for (const Proposal& p : drafts.proposals) num_fed += 1 + p.tokens.size();
  ran.fed.reserve(num_fed);  // spans into it stay valid
  int32_t rows = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const SequenceState& st = *s.seq;
    ran.row_of[i] = rows;
    if (drafts.index[i] != SIZE_MAX) {  // the last known token, then the drafts, each with its row
      const Proposal& d = drafts.proposals[drafts.index[i]];
      const size_t from = ran.fed.size();
      ran.fed.push_back(st.tokens[s.start_pos]);
      ran.fed.insert(ran.fed.end(), d.tokens.begin(), d.tokens.end());
      batch.seqs.push_back({absl::MakeConstSpan(ran.fed).subspan(from), s.start_pos, st.blocks, true});
      rows += static_cast<int32_t>(1 + d.tokens.size());
      stats_.decode_tokens += 1;
    } else {
      const bool scores = ScoresPrompt(s);  // every row of the chunk, not just its last
      batch.seqs.push_back({absl::MakeConstSpan(st.tokens).subspan(s.start_pos, s.num_tokens), s.start_pos, st.blocks,
                            scores});
      ran.prompt_row[i] = scores ? rows : -1;
      ran.row_of[i] = scores ? rows + s.num_tokens - 1 : rows;
      rows += scores ? s.num_tokens : 1;
      const bool decodes = s.samples && s.num_tokens == 1 && s.start_pos >= st.num_prompt;
      (decodes ? stats_.decode_tokens : stats_.prefill_tokens) += decodes ? 1 : s.num_tokens;
    }
    ran.timing.tokens += batch.seqs.back().tokens.size();
    ran.timing.positions += AttendedPositions(s.start_pos, static_cast<double>(batch.seqs.back().tokens.size()));
  }
  ran.timing.rows = rows;
  ran.timing.propose_seconds = drafts.seconds;
  ran.logits = std::move(spare_logits_);
  std::vector<float>* logits = verifier_.on_backend() ? nullptr : &ran.logits;  // null: they stay in the backend
  if (auto status = model_->Forward(batch, kv_, LogitsMode::kLastPerSequence, logits); !status.ok()) return status;
  return ran;
}

absl::StatusOr<Engine::Verified> Engine::Verify(const StepPlan& plan, const Drafts& drafts, const Ran& ran) {
  std::vector<RowsToVerify> rows;  // [sampling sequences]
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.samples) continue;
    RequestRecord& r = RecordOf(s);
    DraftChain chain;
    if (drafts.index[i] != SIZE_MAX) {
      const Proposal& d = drafts.proposals[drafts.index[i]];
      chain = {d.tokens, d.probs, d.backend_probs, d.probs_backend};
    }
    rows.push_back({ran.row_of[i], chain, &r.request.sampling, r.tokens, &r.sampler, &r.uniform,
                    drafts.index[i] != SIZE_MAX, MaskedRows(ran, ran.row_of[i], chain.tokens.size() + 1)});
  }
  ASSIGN_OR_RETURN(std::vector<VerifyResult> verified,
                   verifier_.Run(ran.logits, model_->backend_logits(), ran.timing.rows, model_->config().vocab_size, rows));
  Verified v;
  size_t j = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.samples) continue;
    VerifyResult& vr = verified[j++];
    int32_t k = 0;
    if (const size_t at = drafts.index[i]; at != SIZE_MAX) {
      k = static_cast<int32_t>(drafts.proposals[at].tokens.size());
      // What the model chose where a forced draft was refused (greedy requests: ForcedDrafts).
      const size_t f = drafts.forced[at];
      if (vr.num_accepted < static_cast<int32_t>(f) && RecordOf(s).request.sampling.temperature == 0.0f) {
        spellings_.Learn(absl::MakeConstSpan(drafts.proposals[at].tokens).first(f), vr.num_accepted,
                         vr.tokens[vr.num_accepted]);
      }
      for (SpecStats* st : {&stats_.spec, &RecordOf(s).output.out.spec}) {
        st->Record(k, vr.num_accepted);
        st->RecordGrammar(drafts.forced[at], vr.num_accepted, drafts.cut[at]);
      }
    }
    v.result.outputs.push_back({s.id, std::move(vr.tokens), k});
  }
  RETURN_IF_ERROR(Score(plan, ran, &v));
  return v;
}

absl::Span<const float> Engine::MaskedRows(const Ran& ran, int32_t row, size_t n) const {
  if (ran.masked_row.empty() || ran.masked_row[row] < 0) return {};
  const size_t vocab = model_->config().vocab_size;
  return absl::MakeConstSpan(ran.masked).subspan(static_cast<size_t>(ran.masked_row[row]) * vocab, n * vocab);
}

bool Engine::ScoresPrompt(const ScheduledSeq& s) {
  const RequestRecord& r = RecordOf(s);
  if (r.request.prompt_logprobs < 0) return false;
  // Row j scores position start_pos + j + 1; positions 1 .. num_prompt - 1 are the prompt's.
  return s.start_pos + 1 < r.num_prompt && r.output.out.prompt_logprobs.size() < static_cast<size_t>(r.num_prompt - 1);
}

absl::StatusOr<absl::Span<const float>> Engine::LogitsRow(const Ran& ran, int32_t row, std::vector<float>* scratch) const {
  const size_t vocab = model_->config().vocab_size;
  if (!verifier_.on_backend()) return absl::MakeConstSpan(ran.logits).subspan(static_cast<size_t>(row) * vocab, vocab);
  if (absl::Span<const float> masked = MaskedRows(ran, row, 1); !masked.empty()) return masked;
  scratch->resize(vocab);
  model_->backend().CopyOut(scratch->data(), model_->backend_logits() + static_cast<size_t>(row) * vocab,
                            vocab * sizeof(float));
  RETURN_IF_ERROR(model_->backend().Sync());
  return absl::MakeConstSpan(*scratch);
}

absl::Status Engine::Score(const StepPlan& plan, const Ran& ran, Verified* v) {
  v->logprobs.resize(plan.seqs.size());
  v->prompt_logprobs.resize(plan.seqs.size());
  std::vector<float> row_copy;  // [vocab]: a row copied from the backend
  size_t out = 0;               // the sequence's place in v->result.outputs
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const RequestRecord& r = RecordOf(s);
    if (ran.prompt_row[i] >= 0) {
      const size_t scored = r.output.out.prompt_logprobs.size();
      for (int32_t j = 0; j < s.num_tokens && s.start_pos + j + 1 < r.num_prompt; ++j) {
        const int32_t pos = s.start_pos + j + 1;
        if (scored + v->prompt_logprobs[i].size() != static_cast<size_t>(pos - 1)) continue;  // scored before
        ASSIGN_OR_RETURN(auto row, LogitsRow(ran, ran.prompt_row[i] + j, &row_copy));
        v->prompt_logprobs[i].push_back(ScoreToken(row, r.tokens[pos], r.request.prompt_logprobs));
      }
    }
    if (!s.samples) continue;
    const std::vector<TokenId>& tokens = v->result.outputs[out++].new_tokens;
    if (r.request.logprobs < 0) continue;
    for (size_t j = 0; j < tokens.size(); ++j) {
      ASSIGN_OR_RETURN(auto row, LogitsRow(ran, ran.row_of[i] + static_cast<int32_t>(j), &row_copy));
      v->logprobs[i].push_back(ScoreToken(row, tokens[j], r.request.logprobs));
    }
  }
  return absl::OkStatus();
}

Engine::StepOutputs Engine::Update(const StepPlan& plan, Verified verified, const Drafts& drafts) {
  std::vector<std::vector<BlockId>> tables;  // [plan.seqs][blocks] with a store: before finished ones are released
  if (store_.transfer != nullptr) {
    for (const ScheduledSeq& s : plan.seqs) tables.push_back(s.seq->blocks);
  }
  scheduler_.Update(plan, verified.result);
  if (store_.transfer != nullptr) StoreCommitted(plan, tables);
  FollowConstraints(plan, verified.result);
  StepOutputs step;
  size_t out = 0;  // the sequence's place in verified.result.outputs
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    RequestRecord& r = RecordOf(s);
    OutputUpdate u;
    u.state = &r.output;
    u.prompt_logprobs = std::move(verified.prompt_logprobs[i]);
    if (s.samples) {
      // The scheduler keeps the tokens up to a stop token or the length limit; so do the outputs.
      const size_t kept = r.num_generated() - r.output.out.tokens.size();
      stats_.generated_tokens += static_cast<int64_t>(kept);
      u.tokens = absl::MakeConstSpan(verified.result.outputs[out++].new_tokens).first(kept);
      std::vector<TokenLogprobs>& lp = verified.logprobs[i];
      lp.resize(std::min(kept, lp.size()));
      u.logprobs = std::move(lp);
    }
    u.cached_prompt_tokens = r.num_cached_prompt;
    u.finish = r.status == SeqStatus::kFinished ? r.finish : FinishReason::kNone;
    u.num_preemptions = r.num_preemptions;
    if (drafts.index[i] != SIZE_MAX && r.status == SeqStatus::kRunning && spec_.proposer != nullptr) {
      spec_.proposer->Rollback(r.proposer.get(), r.num_computed);  // the draft's watermark follows the target's
    }
    step.records.push_back(&r);
    step.updates.push_back(std::move(u));
  }
  // The tokens' spans point into verified.result, which the step keeps alive until Publish.
  step.keep = std::move(verified.result);
  return step;
}

std::vector<RequestDelta> Engine::Publish(StepOutputs step) {
  if (!aborted_.empty()) {  // first, as they ended before the step
    StepOutputs all;
    for (RequestId id : aborted_) {
      RequestRecord& r = *records_.at(id);
      all.records.push_back(&r);
      all.updates.push_back({&r.output, {}, {}, {}, 0, FinishReason::kAborted, r.num_preemptions, ""});
    }
    aborted_.clear();
    all.records.insert(all.records.end(), step.records.begin(), step.records.end());
    for (OutputUpdate& u : step.updates) all.updates.push_back(std::move(u));
    all.keep = std::move(step.keep);
    step = std::move(all);
  }
  std::vector<RequestDelta> deltas = outputs_.Process(absl::MakeSpan(step.updates), NowMs());
  for (size_t i = 0; i < step.records.size(); ++i) {
    RequestRecord& r = *step.records[i];
    if (!r.output.finished) continue;
    if (step.updates[i].finish == FinishReason::kStopString) scheduler_.Finish(&r, FinishReason::kStopString);
    if (spec_.proposer != nullptr && !r.aborted) spec_.proposer->Finished(r.proposer.get(), r.tokens, r.num_prompt);
    records_.erase(r.id);  // the request's state, everywhere
  }
  HoldUntilStored(&deltas);
  return deltas;
}

Engine::StepOutputs Engine::FailStep(const StepPlan& plan, const absl::Status& status) {
  StepOutputs step;
  for (const ScheduledSeq& s : plan.seqs) {
    RequestRecord& r = RecordOf(s);
    scheduler_.Finish(&r, FinishReason::kError);
    step.records.push_back(&r);
    step.updates.push_back({&r.output, {}, {}, {}, 0, FinishReason::kError, r.num_preemptions, std::string(status.message())});
  }
  return step;
}

}  // namespace specula

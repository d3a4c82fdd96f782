#include "engine/engine.h"

#include <omp.h>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/logprobs.h"
#include "model/forward_cost.h"
#include "verify/verify.h"

namespace specula {
namespace {


}  // namespace

Engine::Engine(LlamaModel* model, const Tokenizer* tokenizer, const SchedulerConfig& config, SpecConfig spec,
               Clock* clock)
    : model_(model), tokenizer_(tokenizer), scheduler_(config),
      kv_(model->config(), {config.block_size, config.num_blocks, model->kv_dtype()}, &model->backend()),
      outputs_(tokenizer), spec_(spec), clock_(clock != nullptr ? clock : DefaultClock()),
      start_s_(clock_->NowSeconds()) {
  stats_.spec_k_histogram.assign(std::max(config.num_spec_tokens, 0) + 1, 0);
  const bool on_backend = spec_.verify_on == SpecConfig::VerifyOn::kBackend ||
                          (spec_.verify_on == SpecConfig::VerifyOn::kAuto && model_->backend().on_device());
  if (on_backend && model_->logits_stay_in_backend()) backend_verifier_ = std::make_unique<BackendVerifier>(&model_->backend());
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
  if (spec_.verify_on == SpecConfig::VerifyOn::kBackend && backend_verifier_ == nullptr) {
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

absl::Status Engine::AddRequest(Request r) {
  if (active_.count(r.id)) return absl::AlreadyExistsError(absl::StrCat("request id ", r.id, " is already in use"));
  if (auto st = ValidateRequest(r, model_->config().vocab_size, tokenizer_ != nullptr); !st.ok()) return st;
  const double now = NowMs();
  NewSequence n{r.id, r.prompt, r.max_tokens, StopTokenIds(r, model_->config(), tokenizer_), r.priority, now,
                r.prompt_logprobs >= 0};
  r.sampling.output_start = static_cast<int32_t>(r.prompt.size());  // penalties count the generated tokens
  if (auto st = scheduler_.Add(std::move(n)); !st.ok()) return st;
  outputs_.Add(r, now);
  Active a;
  a.sampler = std::make_unique<Sampler>(r.sampling);
  a.uniform = std::make_unique<Uniform>(r.sampling.seed ^ 0x9e3779b97f4a7c15ull);
  a.request = std::move(r);
  active_.emplace(a.request.id, std::move(a));
  return absl::OkStatus();
}

void Engine::Abort(RequestId id) {
  if (!active_.count(id)) return;
  scheduler_.Finish(id, FinishReason::kAborted);
  Complete(id, FinishReason::kAborted);
}

void Engine::Complete(RequestId id, FinishReason reason, std::string error) {
  const SequenceState* s = scheduler_.Get(id);
  if (spec_.proposer != nullptr) {
    if (s != nullptr) spec_.proposer->Finish(id, s->tokens, s->num_prompt);
    spec_.proposer->Release(id);
  }
  if (speculation_ != nullptr) speculation_->Forget(id);
  outputs_.Finish(id, reason, NowMs(), s != nullptr ? s->num_preemptions : 0, std::move(error));
  active_.erase(id);
  scheduler_.Forget(id);
}

std::vector<RequestDelta> Engine::Step() {
  const double start = clock_->NowSeconds();
  StepPlan plan = Schedule();
  if (plan.seqs.empty()) return outputs_.TakeDeltas();
  const std::vector<SpecCandidate> candidates = Candidates(plan);
  if (speculation_ != nullptr) speculation_->Choose(&plan, candidates);
  CountSpeculation(plan, candidates);
  const Drafts drafts = Propose(plan);
  absl::StatusOr<Ran> ran = Forward(plan, drafts);
  absl::StatusOr<StepResult> result = ran.ok() ? Verify(plan, drafts, *ran) : absl::StatusOr<StepResult>(ran.status());
  if (!result.ok()) {
    FailStep(plan, result.status());
    return outputs_.TakeDeltas();
  }
  if (speculation_ != nullptr) {
    ran->timing.seconds = clock_->NowSeconds() - start;
    speculation_->Observe(plan, candidates, *result, ran->timing);
    CopyCostStats();
  }
  Update(plan, *result, drafts);
  if (step_observer_) step_observer_(plan, *result, start);
  return outputs_.TakeDeltas();
}

StepPlan Engine::Schedule() {
  const double now = NowMs();
  StepPlan plan = scheduler_.Schedule(now);
  if (plan.seqs.empty()) {
    if (plan.wait_ms > 0) clock_->SleepFor(std::min(plan.wait_ms, 5.0) / 1000.0);
    return plan;
  }
  ++stats_.steps;
  for (const ScheduledSeq& s : plan.seqs) outputs_.Scheduled(s.id, now);
  if (spec_.proposer != nullptr) {
    for (RequestId id : plan.preempted) spec_.proposer->Release(id);
  }
  return plan;
}

std::vector<SpecCandidate> Engine::Candidates(const StepPlan& plan) {
  std::vector<SpecCandidate> candidates;  // sequences the scheduler made room for drafts
  if (spec_.proposer == nullptr) return candidates;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (s.num_spec == 0) continue;
    const int32_t len = static_cast<int32_t>(scheduler_.Get(s.id)->tokens.size());
    candidates.push_back({s.id, s.num_spec, len, spec_.proposer->CatchUpTokens(s.id, len), i});
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
      const bool decodes = s.samples && s.num_tokens == 1 && s.start_pos >= scheduler_.Get(s.id)->num_prompt;
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

Engine::Drafts Engine::Propose(const StepPlan& plan) {
  Drafts d;
  d.index.assign(plan.seqs.size(), SIZE_MAX);
  std::vector<ProposeInput> inputs;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (s.num_spec == 0) continue;
    d.index[i] = inputs.size();
    inputs.push_back({s.id, scheduler_.Get(s.id)->tokens, s.num_spec, &active_.at(s.id).request.sampling});
  }
  if (inputs.empty()) return d;
  const double t0 = clock_->NowSeconds();
  if (auto status = spec_.proposer->Propose(inputs, &d.proposals); !status.ok()) {
    d.proposals.assign(inputs.size(), Proposal{});  // a failed proposer degrades to plain decoding
  }
  d.seconds = clock_->NowSeconds() - t0;
  return d;
}

absl::StatusOr<Engine::Ran> Engine::Forward(const StepPlan& plan, const Drafts& drafts) {
  ForwardBatch batch;
  Ran ran;
  ran.row_of.resize(plan.seqs.size());
  ran.prompt_row.assign(plan.seqs.size(), -1);
  fed_.resize(plan.seqs.size());
  int32_t rows = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const SequenceState* st = scheduler_.Get(s.id);
    ran.row_of[i] = rows;
    if (drafts.index[i] != SIZE_MAX) {  // the last known token, then the drafts, each with its row
      const Proposal& d = drafts.proposals[drafts.index[i]];
      fed_[i].assign(1, st->tokens[s.start_pos]);
      fed_[i].insert(fed_[i].end(), d.tokens.begin(), d.tokens.end());
      batch.seqs.push_back({fed_[i], s.start_pos, st->blocks, true});
      rows += static_cast<int32_t>(fed_[i].size());
      stats_.decode_tokens += 1;
    } else {
      const bool scores = ScoresPrompt(s);  // every row of the chunk, not just its last
      batch.seqs.push_back({absl::MakeConstSpan(st->tokens).subspan(s.start_pos, s.num_tokens), s.start_pos, st->blocks,
                            scores});
      ran.prompt_row[i] = scores ? rows : -1;
      ran.row_of[i] = scores ? rows + s.num_tokens - 1 : rows;
      rows += scores ? s.num_tokens : 1;
      const bool decodes = s.samples && s.num_tokens == 1 && s.start_pos >= st->num_prompt;
      (decodes ? stats_.decode_tokens : stats_.prefill_tokens) += decodes ? 1 : s.num_tokens;
    }
    ran.timing.tokens += batch.seqs.back().tokens.size();
    ran.timing.positions += AttendedPositions(s.start_pos, static_cast<double>(batch.seqs.back().tokens.size()));
  }
  ran.timing.rows = rows;
  ran.timing.propose_seconds = drafts.seconds;
  std::vector<float>* logits = backend_verifier_ != nullptr ? nullptr : &logits_;  // null: they stay in the backend
  if (auto status = model_->Forward(batch, kv_, LogitsMode::kLastPerSequence, logits); !status.ok()) return status;
  return ran;
}

absl::StatusOr<StepResult> Engine::Verify(const StepPlan& plan, const Drafts& drafts, const Ran& ran) {
  verified_.assign(plan.seqs.size(), VerifyResult{});
  RETURN_IF_ERROR(backend_verifier_ != nullptr ? VerifyOnBackend(plan, drafts, ran) : VerifyOnHost(plan, drafts, ran));
  RETURN_IF_ERROR(Score(plan, ran));
  StepResult result;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.samples) continue;
    int32_t k = 0;
    if (drafts.index[i] != SIZE_MAX) {
      k = static_cast<int32_t>(drafts.proposals[drafts.index[i]].tokens.size());
      stats_.spec.Record(k, verified_[i].num_accepted);
      outputs_.RecordSpec(s.id, k, verified_[i].num_accepted);
    }
    result.outputs.push_back({s.id, std::move(verified_[i].tokens), k});
  }
  return result;
}

absl::Status Engine::VerifyOnHost(const StepPlan& plan, const Drafts& drafts, const Ran& ran) {
  const int32_t vocab = model_->config().vocab_size;
  const int64_t num = static_cast<int64_t>(plan.seqs.size());
  // Draft distributions a proposer left in its backend come to the host first, one at a time (a
  // backend's stream is not for several threads).
  host_q_.resize(drafts.proposals.size());
  for (size_t j = 0; j < drafts.proposals.size(); ++j) {
    const Proposal& d = drafts.proposals[j];
    host_q_[j].clear();
    if (!d.probs.empty() || d.backend_probs == nullptr) continue;
    host_q_[j].resize(d.tokens.size() * static_cast<size_t>(vocab));
    d.probs_backend->CopyOut(host_q_[j].data(), d.backend_probs, host_q_[j].size() * sizeof(float));
    RETURN_IF_ERROR(d.probs_backend->Sync());
  }
  // Every sequence's new tokens over every core: a sampled row is a pass over the vocabulary (an
  // argmax when greedy), 2.6% of a 32-sequence step on one core while the others waited, and a
  // verification up to k + 1 of them (hence a dynamic schedule). Each sequence has its own sampler
  // and verification stream, so any order gives the same tokens.
#pragma omp parallel for schedule(dynamic) if (ran.timing.rows >= 8)
  for (int64_t i = 0; i < num; ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.samples) continue;
    const float* row = logits_.data() + static_cast<size_t>(ran.row_of[i]) * vocab;
    Active& a = active_.at(s.id);
    const SequenceState& st = *scheduler_.Get(s.id);
    if (drafts.index[i] == SIZE_MAX) {
      verified_[i].tokens = {a.sampler->Sample(absl::MakeConstSpan(row, vocab), st.tokens)};
      continue;
    }
    const Proposal& d = drafts.proposals[drafts.index[i]];
    const auto logits = absl::MakeConstSpan(row, (d.tokens.size() + 1) * static_cast<size_t>(vocab));
    const std::vector<float>& q = host_q_[drafts.index[i]].empty() ? d.probs : host_q_[drafts.index[i]];
    verified_[i] = specula::Verify(logits, vocab, {d.tokens, q}, a.request.sampling, st.tokens, *a.uniform,
                                   spec_.synthetic_alpha);
  }
  return absl::OkStatus();
}

absl::Status Engine::VerifyOnBackend(const StepPlan& plan, const Drafts& drafts, const Ran& ran) {
  to_verify_.clear();
  std::vector<size_t> plan_index;  // [to_verify_]
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.samples) continue;
    Active& a = active_.at(s.id);
    DraftChain chain;
    if (drafts.index[i] != SIZE_MAX) {
      const Proposal& d = drafts.proposals[drafts.index[i]];
      chain = {d.tokens, d.probs, d.backend_probs, d.probs_backend};
    }
    to_verify_.push_back({ran.row_of[i], chain, &a.request.sampling, scheduler_.Get(s.id)->tokens, a.sampler.get(),
                          a.uniform.get()});
    plan_index.push_back(i);
  }
  std::vector<VerifyResult> results;
  RETURN_IF_ERROR(backend_verifier_->Run(model_->backend_logits(), ran.timing.rows, model_->config().vocab_size,
                                         to_verify_, spec_.synthetic_alpha, &results));
  for (size_t j = 0; j < results.size(); ++j) verified_[plan_index[j]] = std::move(results[j]);
  return absl::OkStatus();
}

void Engine::Update(const StepPlan& plan, const StepResult& result, const Drafts& drafts) {
  std::vector<RequestId> finished = scheduler_.Update(plan, result);
  std::vector<RequestId> stop_strings;  // requests whose text now holds a stop string
  const double now = NowMs();
  for (const SeqOutput& o : result.outputs) {
    const SequenceState& st = *scheduler_.Get(o.id);
    // The scheduler keeps the tokens up to a stop token or the length limit; so do the outputs.
    const size_t kept = st.num_generated() - outputs_.num_tokens(o.id);
    stats_.generated_tokens += static_cast<int64_t>(kept);
    auto lp = step_logprobs_.find(o.id);
    const auto logprobs = lp == step_logprobs_.end() ? absl::Span<const TokenLogprobs>()
                                                     : absl::MakeConstSpan(lp->second).first(std::min(kept, lp->second.size()));
    if (outputs_.Append(o.id, absl::MakeConstSpan(o.new_tokens).first(kept), now, st.num_cached_prompt, logprobs)) {
      stop_strings.push_back(o.id);
      if (st.status != SeqStatus::kFinished) finished.push_back(o.id);
      scheduler_.Finish(o.id, FinishReason::kStopString);
    }
  }
  for (RequestId id : finished) {
    const bool stop_string = std::find(stop_strings.begin(), stop_strings.end(), id) != stop_strings.end();
    Complete(id, stop_string ? FinishReason::kStopString : scheduler_.Get(id)->finish);
  }
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SequenceState* st = scheduler_.Get(plan.seqs[i].id);
    if (drafts.index[i] != SIZE_MAX && st != nullptr && st->status == SeqStatus::kRunning) {
      spec_.proposer->Rollback(st->id, st->num_computed);  // the draft's watermark follows the target's
    }
  }
}

bool Engine::ScoresPrompt(const ScheduledSeq& s) const {
  const Active& a = active_.at(s.id);
  if (a.request.prompt_logprobs < 0) return false;
  const int32_t num_prompt = scheduler_.Get(s.id)->num_prompt;
  // Row j scores position start_pos + j + 1; positions 1 .. num_prompt - 1 are the prompt's.
  return s.start_pos + 1 < num_prompt && outputs_.num_prompt_logprobs(s.id) < static_cast<size_t>(num_prompt - 1);
}

absl::StatusOr<absl::Span<const float>> Engine::LogitsRow(int32_t row) {
  const size_t vocab = model_->config().vocab_size;
  if (backend_verifier_ == nullptr) return absl::MakeConstSpan(logits_).subspan(static_cast<size_t>(row) * vocab, vocab);
  row_.resize(vocab);
  model_->backend().CopyOut(row_.data(), model_->backend_logits() + static_cast<size_t>(row) * vocab, vocab * sizeof(float));
  RETURN_IF_ERROR(model_->backend().Sync());
  return absl::MakeConstSpan(row_);
}

absl::Status Engine::Score(const StepPlan& plan, const Ran& ran) {
  step_logprobs_.clear();
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const Request& r = active_.at(s.id).request;
    if (ran.prompt_row[i] >= 0) {
      const SequenceState& st = *scheduler_.Get(s.id);
      for (int32_t j = 0; j < s.num_tokens && s.start_pos + j + 1 < st.num_prompt; ++j) {
        const int32_t pos = s.start_pos + j + 1;
        if (outputs_.num_prompt_logprobs(s.id) != static_cast<size_t>(pos - 1)) continue;  // scored before
        ASSIGN_OR_RETURN(auto row, LogitsRow(ran.prompt_row[i] + j));
        outputs_.AddPromptLogprobs(s.id, ScoreToken(row, st.tokens[pos], r.prompt_logprobs));
      }
    }
    if (!s.samples || r.logprobs < 0) continue;
    std::vector<TokenLogprobs>& out = step_logprobs_[s.id];
    for (size_t j = 0; j < verified_[i].tokens.size(); ++j) {
      ASSIGN_OR_RETURN(auto row, LogitsRow(ran.row_of[i] + static_cast<int32_t>(j)));
      out.push_back(ScoreToken(row, verified_[i].tokens[j], r.logprobs));
    }
  }
  return absl::OkStatus();
}

void Engine::FailStep(const StepPlan& plan, const absl::Status& status) {
  for (const ScheduledSeq& s : plan.seqs) {
    scheduler_.Finish(s.id, FinishReason::kError);
    Complete(s.id, FinishReason::kError, std::string(status.message()));
  }
}

}  // namespace specula

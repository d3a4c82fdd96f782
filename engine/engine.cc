#include "engine/engine.h"

#include <thread>

#include "core/categorical.h"

#include "absl/strings/str_cat.h"

namespace specula {

Engine::Engine(LlamaModel* model, const Tokenizer* tokenizer, const SchedulerConfig& config, SpecConfig spec)
    : model_(model), tokenizer_(tokenizer), scheduler_(config),
      kv_(model->config(), {config.block_size, config.num_blocks, model->kv_dtype()}, &model->backend()), spec_(spec) {
  stats_.spec_k_histogram.assign(std::max(config.num_spec_tokens, 0) + 1, 0);
  if (spec_.adaptive && spec_.proposer != nullptr && model_->status().ok() && kv_.status().ok()) {
    const auto t0 = std::chrono::steady_clock::now();
    calibration_ = Calibrate();
    stats_.cost_measure_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.cost_measured_tokens = target_meter_.tokens;
  }
}

namespace {

// Shapes measured when the engine is built: 1, 2, 4, 8 tokens. Measuring up to 32 for batches past
// 4 (so that a batch of 8 could take 2 drafts each from its first step) took 18-19 ms for the
// tinystories pair against 3-8 ms, ~5% of a 32-prompt CLI job, which ran at 0.92x of no
// speculation with auto speculating on no step. The larger shapes come lazily instead.
constexpr int32_t kStartupTokens = 8;
constexpr double kCalibrationShare = 0.005;  // of the steps' time, for the larger shapes

}  // namespace

absl::Status Engine::Calibrate() {
  grid_ = CostGrid{std::min(scheduler_.config().max_num_seqs, 8), scheduler_.config().block_size,
                   spec_.calibration_seconds, kStartupTokens};
  auto target = spec_.target_cost.has_value() ? *spec_.target_cost : MeasureForwardCost(*model_, grid_);
  if (!target.ok()) return target.status();
  if (!spec_.target_cost.has_value()) target_meter_ = Meter::Of(*target);
  const ModelConfig* draft_config = spec_.proposer->model_config();
  std::unique_ptr<StepCost> draft;
  if (draft_config != nullptr) {
    // The draft's one-token forward first: whether drafts could pay at all depends on it alone
    // (each draft is one token, after a catch-up of about one), and where they cannot, its larger
    // shapes were most of the startup measurement (the tinystories pair: 12-19 ms of a 0.4 s CLI
    // job). They are measured below where drafts could pay.
    CostGrid first = grid_;
    first.max_tokens = 1;
    auto points = spec_.draft_cost.has_value() ? *spec_.draft_cost : spec_.proposer->MeasureCost(first);
    if (!points.ok()) return points.status();
    if (!spec_.draft_cost.has_value()) draft_meter_ = Meter::Of(*points);
    draft = std::make_unique<StepCost>(*points);
  }
  controller_ = std::make_unique<SpecController>(&model_->config(), StepCost(*target), draft_config, std::move(draft));
  // Whether drafts could pay at all, even every one accepted. Where only shapes past those measured
  // could tell (the table's last segment, noisy at these sizes, left it open in 3 of 20 CLI jobs on
  // the tinystories pair), the next ones are measured now.
  const SchedulerConfig& sc = scheduler_.config();
  while (!controller_->DraftsCouldPay(sc.max_num_seqs, sc.num_spec_tokens)) {
    if (!controller_->wants_larger_shapes()) {
      stats_.drafts_cannot_pay = true;
      scheduler_.StopSpeculation();  // the stats still count the plain decode steps (Step)
      return absl::OkStatus();       // nothing more to measure
    }
    if (!MeasureNext(&target_meter_)) break;  // cannot tell: auto as usual
  }
  // Where drafts could pay, a batch of up to 8 sequences has its step with one draft each measured
  // now: until it was (between steps, when the controller asked for it), a batch of 8 ran plain
  // steps, and the draft then lagged so far behind (its first forward runs the tokens it skipped)
  // that whole waves of requests never drafted (auto at 0.87x of k = 1 at synthetic batch 8).
  // Larger batches measure their shapes between steps: a plain step of 32 sequences is already
  // past the startup table, and measuring up to 64 tokens at startup would cost a short job more.
  while (sc.max_num_seqs <= grid_.batch && target_meter_.tokens < 2 * sc.max_num_seqs && MeasureNext(&target_meter_)) {
  }
  while (draft_meter_.tokens < grid_.max_tokens && MeasureNext(&draft_meter_)) {  // false once done
  }
  return absl::OkStatus();
}

bool Engine::MeasureNext(Meter* m) {
  if (m->done) return false;
  CostGrid grid = grid_;
  grid.max_tokens = 2 * m->tokens;
  const auto t0 = std::chrono::steady_clock::now();
  auto points = m == &target_meter_ ? MeasureForwardCost(*model_, grid) : spec_.proposer->MeasureCost(grid);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  calibration_seconds_ += seconds;
  stats_.cost_measure_seconds += seconds;
  if (!points.ok() || points->empty() || points->back().tokens <= m->tokens) {
    m->done = true;  // the largest shape (or the budget) reached; a failure keeps the table it has
    return false;
  }
  *m = Meter::Of(*points);
  if (m == &target_meter_) {
    stats_.cost_measured_tokens = m->tokens;
    controller_->SetTargetPoints(std::move(points).value());
  } else {
    controller_->SetDraftPoints(std::move(points).value());
  }
  return true;
}

void Engine::CalibrateMore(double step_seconds) {
  step_seconds_ += step_seconds;
  for (Meter* m : {&target_meter_, &draft_meter_}) {
    if (m->done) continue;
    // The next shape takes about twice the last one's time (2.5x measured on tiny models), three runs;
    // at once where the controller found a step that might gain past the measured shapes.
    const bool wanted = m == &target_meter_ && controller_->wants_larger_shapes();
    if (!wanted && calibration_seconds_ + 6 * m->seconds > kCalibrationShare * step_seconds_) return;
    if (MeasureNext(m)) return;  // one shape per step
  }
}

absl::Status Engine::Validate() const {
  if (!model_->status().ok()) return model_->status();
  if (!kv_.status().ok()) return kv_.status();
  if (!calibration_.ok()) return calibration_;
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

double Engine::NowMs() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
}

absl::Status Engine::AddRequest(Request r) {
  if (active_.count(r.id)) return absl::AlreadyExistsError(absl::StrCat("request id ", r.id, " is already in use"));
  if (auto st = ValidateSamplingParams(r.sampling); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": ", st.message()));
  }
  for (TokenId t : r.prompt) {
    if (t < 0 || t >= model_->config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": token id ", t, " outside the vocabulary"));
    }
  }
  if (!r.stop_strings.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("request ", r.id, ": stop strings need a tokenizer"));
  }
  NewSequence n{r.id, r.prompt, r.max_tokens, r.stop_ids, r.priority, NowMs()};
  if (!r.ignore_eos && tokenizer_ != nullptr) {
    n.stop_ids.insert(n.stop_ids.end(), tokenizer_->eos_ids().begin(), tokenizer_->eos_ids().end());
  }
  if (auto st = scheduler_.Add(std::move(n)); !st.ok()) return st;
  Active a;
  a.sampler = std::make_unique<Sampler>(r.sampling);
  a.uniform = std::make_unique<Uniform>(r.sampling.seed ^ 0x9e3779b97f4a7c15ull);
  a.out.id = r.id;
  a.out.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  a.out.arrival_ms = NowMs();
  a.request = std::move(r);
  active_.emplace(a.request.id, std::move(a));
  return absl::OkStatus();
}

void Engine::Abort(RequestId id) {
  if (!active_.count(id)) return;
  scheduler_.Finish(id, FinishReason::kAborted);
  aborted_.push_back(Complete(id, FinishReason::kAborted));
}

RequestOutput Engine::Complete(RequestId id, FinishReason reason) {
  if (spec_.proposer != nullptr) spec_.proposer->Release(id);
  if (controller_ != nullptr) controller_->Forget(id);
  auto it = active_.find(id);
  RequestOutput out = std::move(it->second.out);
  active_.erase(it);
  out.finish = reason;
  out.finish_ms = NowMs();
  if (const SequenceState* s = scheduler_.Get(id)) {
    out.num_preemptions = s->num_preemptions;
    // A step can bring several tokens (speculation); the scheduler drops those past a stop token
    // or the length limit, and so does the output.
    const size_t generated = static_cast<size_t>(std::max(s->num_generated(), 0));
    if (out.tokens.size() > generated) {
      out.tokens.resize(generated);
      out.token_ms.resize(generated);
      if (tokenizer_ != nullptr) {
        std::vector<TokenId> ids = {s->tokens[s->num_prompt - 1]};
        ids.insert(ids.end(), out.tokens.begin(), out.tokens.end());
        out.text.clear();
        for (size_t i = 1; i < ids.size(); ++i) out.text += tokenizer_->DecodeToken(ids[i - 1], ids[i]);
      }
    }
  }
  scheduler_.Forget(id);
  return out;
}

VerifyResult Engine::VerifyDrafts(Active& a, const SequenceState& st, const Proposal& draft, const float* rows) {
  const int32_t vocab = model_->config().vocab_size;
  const int32_t k = static_cast<int32_t>(draft.tokens.size());
  auto row = [&](int32_t i) { return absl::MakeConstSpan(rows + static_cast<size_t>(i) * vocab, vocab); };
  const SamplingParams& sp = a.request.sampling;
  if (sp.temperature == 0.0f && sp.repetition_penalty == 1.0f) {
    // Greedy without a penalty: each row's distribution is one-hot at its argmax, so only the rows up
    // to the first rejection are read, once each (building the k + 1 distributions took five passes
    // over every row, on one core: a batch of 8 verifying 2 drafts each spent ~15% of its step there).
    if (spec_.synthetic_alpha >= 0) {
      VerifyResult r;  // as below
      while (r.num_accepted < k && a.uniform->Next() < spec_.synthetic_alpha) r.tokens.push_back(draft.tokens[r.num_accepted++]);
      r.bonus = r.num_accepted == k;
      a.uniform->Next();  // the draw a one-hot distribution ignores, so the stream stays the general path's
      r.tokens.push_back(static_cast<TokenId>(Argmax(row(r.num_accepted))));
      return r;
    }
    std::vector<TokenId> argmax;  // [rows read]: up to the first mismatch, or all k + 1
    for (int32_t i = 0; i <= k; ++i) {
      argmax.push_back(static_cast<TokenId>(Argmax(row(i))));
      if (i < k && argmax[i] != draft.tokens[i]) break;
    }
    return GreedyVerify(absl::MakeConstSpan(draft.tokens).subspan(0, std::min<size_t>(argmax.size(), k)), argmax);
  }
  // The target's sampling distribution after each prefix: rows i = 0..k, history = tokens + drafts[0, i).
  // Per thread: sequences are verified in parallel.
  thread_local std::vector<float> target_probs, row_probs;  // [k + 1, vocab], [vocab]
  std::vector<TokenId> history(st.tokens.begin(), st.tokens.end());
  target_probs.resize(static_cast<size_t>(k + 1) * vocab);
  for (int32_t i = 0; i <= k; ++i) {
    a.sampler->Probabilities(row(i), history, &row_probs);
    std::copy(row_probs.begin(), row_probs.end(), target_probs.begin() + static_cast<size_t>(i) * vocab);
    if (i < k) history.push_back(draft.tokens[i]);
  }
  if (spec_.synthetic_alpha >= 0) {
    // Cost studies only: accept each draft with a fixed probability, then take the target's token.
    VerifyResult r;
    while (r.num_accepted < k && a.uniform->Next() < spec_.synthetic_alpha) r.tokens.push_back(draft.tokens[r.num_accepted++]);
    r.bonus = r.num_accepted == k;
    r.tokens.push_back(SampleCategorical(absl::MakeConstSpan(target_probs).subspan(static_cast<size_t>(r.num_accepted) * vocab, vocab),
                                  a.uniform->Next()));
    return r;
  }
  if (sp.temperature == 0.0f) {
    std::vector<TokenId> argmax(k + 1);  // probabilities are one-hot at the (penalized) argmax
    for (int32_t i = 0; i <= k; ++i) {
      const float* p = target_probs.data() + static_cast<size_t>(i) * vocab;
      argmax[i] = static_cast<TokenId>(std::max_element(p, p + vocab) - p);
    }
    return GreedyVerify(draft.tokens, argmax);
  }
  return RejectionSample(draft.tokens, target_probs, draft.probs, vocab, *a.uniform);
}

void Engine::ChooseSpeculation(StepPlan* plan, std::vector<SpecCandidate>* candidates, std::vector<size_t>* index) {
  double tokens = 0, positions = 0;  // the step's work without drafts
  double fixed_tokens = 0;           // tokens the step yields besides the candidates'
  for (size_t i = 0; i < plan->seqs.size(); ++i) {
    const ScheduledSeq& s = plan->seqs[i];
    tokens += s.num_tokens - s.num_spec;
    positions += AttendedPositions(s.start_pos, s.num_tokens - s.num_spec);
    if (s.num_spec == 0) {
      fixed_tokens += s.samples ? 1 : 0;
      continue;
    }
    const int32_t len = static_cast<int32_t>(scheduler_.Get(s.id)->tokens.size());
    index->push_back(i);
    candidates->push_back({s.id, s.num_spec, len, spec_.proposer->CatchUpTokens(s.id, len)});
  }
  if (candidates->empty()) return;
  if (controller_ != nullptr) {
    const double base = ForwardFlops(model_->config(), tokens, static_cast<double>(plan->seqs.size()), positions);
    const std::vector<int32_t> k = controller_->Choose(base, fixed_tokens, *candidates);
    for (size_t c = 0; c < index->size(); ++c) plan->SetNumSpec((*index)[c], k[c]);
  }
  ++stats_.decode_steps;
  bool any = false;
  for (size_t i : *index) {
    const int32_t k = plan->seqs[i].num_spec;
    ++stats_.spec_k_histogram[std::min<size_t>(k, stats_.spec_k_histogram.size() - 1)];
    any = any || k > 0;
  }
  if (!any) ++stats_.spec_off_steps;
}

std::vector<RequestOutput> Engine::Step() {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point step_start = Clock::now();
  std::vector<RequestOutput> done = std::move(aborted_);
  aborted_.clear();
  const double schedule_ms = NowMs();
  StepPlan plan = scheduler_.Schedule(schedule_ms);
  for (const ScheduledSeq& s : plan.seqs) {
    RequestOutput& out = active_.at(s.id).out;
    if (out.scheduled_ms == 0) out.scheduled_ms = schedule_ms;
  }
  if (plan.seqs.empty()) {
    if (plan.wait_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(std::min(plan.wait_ms, 5.0)));
    return done;
  }
  ++stats_.steps;
  std::vector<SpecCandidate> candidates;  // sequences that may speculate
  std::vector<size_t> candidate_index;     // their plan indices
  if (spec_.proposer != nullptr) {
    for (RequestId id : plan.preempted) spec_.proposer->Release(id);
    ChooseSpeculation(&plan, &candidates, &candidate_index);
  }
  // Drafts for the speculating sequences.
  std::vector<ProposeInput> inputs;
  std::vector<size_t> spec_index(plan.seqs.size(), SIZE_MAX);  // plan index -> inputs index
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (plan.seqs[i].num_spec == 0) continue;
    const SequenceState* st = scheduler_.Get(plan.seqs[i].id);
    spec_index[i] = inputs.size();
    inputs.push_back({plan.seqs[i].id, st->tokens, plan.seqs[i].num_spec, &active_.at(plan.seqs[i].id).request.sampling});
  }
  std::vector<Proposal> drafts;
  double propose_seconds = 0;
  if (!inputs.empty()) {
    const Clock::time_point t0 = Clock::now();
    if (auto status = spec_.proposer->Propose(inputs, &drafts); !status.ok()) {
      drafts.assign(inputs.size(), Proposal{});  // a failed proposer degrades to plain decoding
    }
    propose_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  ForwardBatch batch;
  bool decoding = false;  // some sequence decodes (counted here where drafts cannot pay)
  std::vector<std::vector<TokenId>> fed(plan.seqs.size());  // last token + drafts, for speculating sequences
  std::vector<int32_t> row_of(plan.seqs.size());            // first logits row of each sequence
  int32_t rows = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const SequenceState* st = scheduler_.Get(s.id);
    row_of[i] = rows;
    if (spec_index[i] != SIZE_MAX) {
      const Proposal& d = drafts[spec_index[i]];
      fed[i].push_back(st->tokens[s.start_pos]);
      fed[i].insert(fed[i].end(), d.tokens.begin(), d.tokens.end());
      batch.seqs.push_back({fed[i], s.start_pos, st->blocks, true});
      rows += static_cast<int32_t>(fed[i].size());
      stats_.decode_tokens += 1;
      continue;
    }
    batch.seqs.push_back({absl::MakeConstSpan(st->tokens).subspan(s.start_pos, s.num_tokens), s.start_pos, st->blocks});
    rows += 1;
    if (s.samples && s.num_tokens == 1 && s.start_pos >= st->num_prompt) {
      stats_.decode_tokens += 1;
      if (stats_.drafts_cannot_pay) {  // a decoding sequence the scheduler made no room for drafts
        ++stats_.spec_k_histogram[0];
        decoding = true;
      }
    } else {
      stats_.prefill_tokens += s.num_tokens;
    }
  }
  if (decoding) {
    ++stats_.decode_steps;
    ++stats_.spec_off_steps;
  }
  StepResult result;
  if (auto status = model_->Forward(batch, kv_, LogitsMode::kLastPerSequence, &logits_); !status.ok()) {
    // Only reachable through a bug or corrupt state: fail this step's requests, keep the rest.
    for (const ScheduledSeq& s : plan.seqs) {
      scheduler_.Finish(s.id, FinishReason::kError);
      RequestOutput out = Complete(s.id, FinishReason::kError);
      out.error = std::string(status.message());
      done.push_back(std::move(out));
    }
    return done;
  }
  const int32_t vocab = model_->config().vocab_size;
  const double now = NowMs();
  // Every sequence's new tokens first, over every core: a sampled row is a pass over the vocabulary
  // (an argmax when greedy), 2.6% of a 32-sequence step's time on one core while the others waited,
  // and a verification up to k + 1 of them (hence a dynamic schedule). Each sequence has its own
  // sampler and verification stream, so any order gives the same tokens.
  const int64_t num = static_cast<int64_t>(plan.seqs.size());
  sampled_.assign(num, -1);
  verified_.assign(num, VerifyResult{});
#pragma omp parallel for schedule(dynamic) if (rows >= 8)
  for (int64_t i = 0; i < num; ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.samples) continue;
    const float* row = logits_.data() + static_cast<size_t>(row_of[i]) * vocab;
    Active& a = active_.at(s.id);
    const SequenceState& st = *scheduler_.Get(s.id);
    if (spec_index[i] != SIZE_MAX) {
      verified_[i] = VerifyDrafts(a, st, drafts[spec_index[i]], row);
    } else {
      sampled_[i] = a.sampler->Sample(absl::MakeConstSpan(row, vocab), st.tokens);
    }
  }
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.samples) continue;
    Active& a = active_.at(s.id);
    const SequenceState* st = scheduler_.Get(s.id);
    SeqOutput o{s.id, {}, 0};
    if (spec_index[i] != SIZE_MAX) {
      const Proposal& d = drafts[spec_index[i]];
      const VerifyResult& v = verified_[i];
      o.new_tokens = v.tokens;
      o.num_drafts = static_cast<int32_t>(d.tokens.size());
      a.out.spec.Record(o.num_drafts, v.num_accepted);
      stats_.spec.Record(o.num_drafts, v.num_accepted);
      if (controller_ != nullptr) controller_->ObserveAcceptance(s.id, o.num_drafts, v.num_accepted);
    } else {
      o.new_tokens = {sampled_[i]};
    }
    if (a.out.tokens.empty()) {
      a.out.first_token_ms = now;
      a.out.cached_prompt_tokens = st->num_cached_prompt;
    }
    for (TokenId t : o.new_tokens) {
      const TokenId prev = a.out.tokens.empty() ? st->tokens.back() : a.out.tokens.back();
      a.out.tokens.push_back(t);
      a.out.token_ms.push_back(now);
      ++stats_.generated_tokens;
      if (tokenizer_ != nullptr) a.out.text += tokenizer_->DecodeToken(prev, t);
    }
    result.outputs.push_back(std::move(o));
  }
  for (RequestId id : scheduler_.Update(plan, result)) {
    done.push_back(Complete(id, scheduler_.Get(id)->finish));
  }
  if (spec_.proposer != nullptr) {
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const SequenceState* st = scheduler_.Get(plan.seqs[i].id);
      if (spec_index[i] != SIZE_MAX && st != nullptr && st->status == SeqStatus::kRunning) {
        spec_.proposer->Rollback(st->id, st->num_computed);  // the draft's watermark follows the target's
      }
    }
  }
  // Stop strings end a request and are cut from its text.
  for (const SeqOutput& o : result.outputs) {
    auto it = active_.find(o.id);
    if (it == active_.end()) continue;
    for (const std::string& stop : it->second.request.stop_strings) {
      const size_t pos = it->second.out.text.find(stop);
      if (stop.empty() || pos == std::string::npos) continue;
      it->second.out.text.resize(pos);
      scheduler_.Finish(o.id, FinishReason::kStopString);
      done.push_back(Complete(o.id, FinishReason::kStopString));
      break;
    }
  }
  if (controller_ == nullptr || stats_.drafts_cannot_pay) return done;
  if (spec_.refine_cost) {
    // The step as it ran: the target's forward (and everything around it) and the draft's.
    double tokens = 0, positions = 0;
    for (const SequenceInput& in : batch.seqs) {
      tokens += in.tokens.size();
      positions += AttendedPositions(in.start_pos, static_cast<int32_t>(in.tokens.size()));
    }
    std::vector<int32_t> k;
    for (size_t i : candidate_index) k.push_back(plan.seqs[i].num_spec);
    const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    const bool draft_model = spec_.proposer->model_config() != nullptr;
    controller_->ObserveStep(ForwardFlops(model_->config(), tokens, rows, positions),
                             draft_model ? seconds - propose_seconds : seconds,
                             controller_->DraftFlops(candidates, k), propose_seconds, !inputs.empty());
  }
  CalibrateMore(std::chrono::duration<double>(Clock::now() - step_start).count());
  return done;
}

}  // namespace specula

#include "sim/replica.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace specula {
namespace {

constexpr TokenId kFirstId = 2;  // ids below are the specials a tokenizer may stop on
constexpr TokenId kIdRange = 30000;

// A model's forwards as MeasureForwardCost (model/forward_cost.cc) times them: n = 1, 2, 4, ...
// new tokens over min(n, batch) sequences at a short context, every row with logits, continuing
// past the shapes measured before; the clock advances by the three runs of each, as there.
MeasureCostFn SimulatedMeter(const StepTimeModel* model, ForwardShape shape, Clock* clock) {
  auto points = std::make_shared<std::vector<CostPoint>>();
  return [=](const CostGrid& g) -> absl::StatusOr<std::vector<CostPoint>> {
    constexpr int32_t kStart = 32;
    const int32_t batch = std::max(g.batch, 1);
    const int32_t max_tokens = std::min(512, g.max_tokens);
    double spent = 0, last = points->empty() ? 0.0 : points->back().seconds;
    for (int32_t n = points->empty() ? 1 : 2 * points->back().tokens; n <= max_tokens; n *= 2) {
      if (last > 0 && spent + 3 * 2 * last > g.budget_seconds) break;
      const int32_t seqs = std::min(n, batch), per_seq = (n + seqs - 1) / seqs, tokens = seqs * per_seq;
      const double positions = seqs * AttendedPositions(kStart, per_seq);
      last = model->Seconds({double(seqs), double(tokens), double(tokens), positions});
      spent += 3 * last;
      points->push_back({ForwardFlops(shape, tokens, tokens, positions), last, tokens});
    }
    clock->SleepFor(spent);
    return *points;
  };
}

}  // namespace

Replica::Replica(ReplicaConfig config, AcceptanceModel* acceptance, uint64_t seed)
    : config_(std::move(config)), acceptance_(acceptance), rng_(seed), jitter_rng_(seed ^ 0x6a09e667f3bcc909ull),
      scheduler_(config_.scheduler),
      admission_(config_.admission) {
  if (!config_.speculate) scheduler_.StopSpeculation();
  k_histogram_.assign(std::max(scheduler_.config().num_spec_tokens, 0) + 1, 0);
  if (!config_.speculate || !config_.adaptive) return;
  AdaptiveConfig ac;
  ac.max_num_seqs = config_.scheduler.max_num_seqs;
  ac.block_size = config_.scheduler.block_size;
  ac.max_spec_tokens = config_.scheduler.num_spec_tokens;
  ac.clock = &clock_;
  ac.target_cost = config_.target_cost;
  ac.draft_cost = config_.draft_cost;
  ac.refine_cost = config_.refine_cost;
  auto s = AdaptiveSpeculation::Create(ac, config_.target_shape, config_.draft_shape,
                                       SimulatedMeter(&config_.target, config_.target_shape, &clock_),
                                       config_.draft_shape.has_value()
                                           ? SimulatedMeter(&config_.draft, *config_.draft_shape, &clock_)
                                           : MeasureCostFn());
  if (s.ok()) speculation_ = std::move(s).value();  // the simulated meters do not fail
  if (speculation_ != nullptr && speculation_->drafts_cannot_pay()) scheduler_.StopSpeculation();
}

std::vector<TokenId> Replica::Prompt(const SimRequest& r) {
  std::uniform_int_distribution<TokenId> id(kFirstId, kIdRange - 1);
  std::vector<TokenId> p;
  if (r.prompt_id >= 0) {  // the same tokens for every request of this prompt, on any replica
    std::mt19937_64 same(0x51ed5eedull ^ (static_cast<uint64_t>(r.prompt_id) * 0x9e3779b97f4a7c15ull));
    for (int32_t i = 0; i < r.prompt_len; ++i) p.push_back(id(same));
    return p;
  }
  p.reserve(r.prompt_len);
  if (r.session >= 0 && r.shared_prefix > 0) {
    const std::vector<TokenId>& before = sessions_[r.session];
    p.assign(before.begin(), before.begin() + std::min<size_t>(before.size(), std::min(r.shared_prefix, r.prompt_len)));
  }
  while (static_cast<int32_t>(p.size()) < r.prompt_len) p.push_back(id(rng_));
  if (r.session >= 0) sessions_[r.session] = p;
  return p;
}

std::string Replica::Submit(const SimRequest& r, double now_s) {
  // Only a running forward is slowed: a wait for the batching window runs none.
  if (in_step_ && !plan_.seqs.empty()) delay_s_ += r.text_prompt ? config_.arrival_s : config_.arrival_token_ids_s;
  records_.emplace_back();
  records_.back().request = r;
  QueueState q;
  q.queued = static_cast<int32_t>(pending_.size()) + unfinished_ - running_snapshot_;
  q.free_slots = std::max(0, config_.scheduler.max_num_seqs - running_snapshot_);
  q.oldest_queued_ms = oldest_queued_ms_;
  std::string detail;
  std::string reason = admission_.Check(r.priority, q, now_s, &detail);
  if (!reason.empty()) {
    records_.back().refused = reason;
    return reason;
  }
  pending_.push_back(records_.size() - 1);
  no_token_yet_.insert(r.arrival_s);
  return "";
}

void Replica::AddPending() {
  for (size_t rec : pending_) {
    const SimRequest& r = records_[rec].request;
    NewSequence n;
    n.id = r.id;
    n.prompt = Prompt(r);
    n.max_new_tokens = std::max(r.output_len, 1);
    n.priority = r.priority;
    n.arrival_ms = r.arrival_s * 1000.0;
    auto seq = std::make_unique<Seq>();
    seq->record = rec;
    if (!scheduler_.Add(std::move(n), seq.get()).ok()) {  // longer than a replica can hold: refused as the engine would
      records_[rec].refused = "invalid_argument";
      no_token_yet_.erase(no_token_yet_.find(r.arrival_s));
      continue;
    }
    seqs_[r.id] = std::move(seq);
    ++unfinished_;
  }
  pending_.clear();
}

std::vector<SpecCandidate> Replica::Candidates(const StepPlan& plan) {
  std::vector<SpecCandidate> c;  // as Engine::Candidates, the draft model's lag as DraftModelProposer's
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (s.num_spec == 0) continue;
    Seq& seq = static_cast<Seq&>(*s.seq);
    const int32_t len = static_cast<int32_t>(seq.tokens.size());
    const int32_t catch_up = config_.draft_shape ? len - std::min(seq.draft_computed, len - 1) : 0;
    c.push_back({s.id, s.num_spec, len, catch_up, i, &seq.acceptance});
  }
  return c;
}

double Replica::RunDraft(const StepPlan& plan, absl::Span<const SpecCandidate> c) {
  double seconds = 0;
  if (!config_.draft_shape) {
    for (const SpecCandidate& x : c) seconds += plan.seqs[x.plan_index].num_spec > 0 ? config_.propose_seconds_per_seq : 0;
    return seconds;
  }
  // DraftModelProposer's forwards: the catch-up and first draft together, then one token each.
  for (int32_t j = 0;; ++j) {
    StepWork w;
    for (const SpecCandidate& x : c) {
      const int32_t k = plan.seqs[x.plan_index].num_spec;
      if (j >= k) continue;
      Seq& seq = static_cast<Seq&>(*plan.seqs[x.plan_index].seq);
      const int32_t first = j == 0 ? std::min(seq.draft_computed, x.len - 1) : x.len + j - 1;
      const int32_t n = j == 0 ? x.len - first : 1;
      w.seqs += 1;
      w.tokens += n;
      w.rows += 1;
      w.positions += AttendedPositions(first, n);
      if (j == k - 1) seq.draft_computed = x.len + k - 1;
    }
    if (w.seqs == 0) break;
    seconds += config_.draft.Seconds(w);
  }
  return seconds;
}

StepResult Replica::Draw(const StepPlan& plan, const std::vector<int32_t>& drafts) {
  std::uniform_int_distribution<TokenId> id(kFirstId, kIdRange - 1);
  StepResult r;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.samples) continue;
    const int32_t accepted =
        drafts[i] > 0 ? acceptance_->Accepted(s.id, drafts[i], s.seq->num_generated(), rng_) : 0;
    draft_tokens_ += drafts[i];
    accepted_tokens_ += accepted;
    std::vector<TokenId> tokens(accepted + 1);
    for (TokenId& t : tokens) t = id(rng_);
    r.outputs.push_back({s.id, std::move(tokens), drafts[i]});
  }
  return r;
}

std::optional<double> Replica::Begin(double now_s) {
  AddPending();
  if (!scheduler_.HasUnfinished()) return std::nullopt;
  plan_ = scheduler_.Schedule(now_s * 1000.0);
  if (plan_.seqs.empty()) {
    // The batching window (as Engine::Schedule sleeps), else nothing can run until something ends.
    if (plan_.wait_ms <= 0) return std::nullopt;
    in_step_ = true;
    step_start_s_ = now_s;
    return std::min(plan_.wait_ms, 5.0) / 1000.0;
  }
  ++num_steps_;
  for (RequestId id : plan_.preempted) seqs_.at(id)->draft_computed = 0;  // the proposer's Preempted
  candidates_ = Candidates(plan_);
  if (speculation_ != nullptr) speculation_->Choose(&plan_, candidates_);
  for (const SpecCandidate& c : candidates_) {
    ++k_histogram_[std::min<size_t>(plan_.seqs[c.plan_index].num_spec, k_histogram_.size() - 1)];
  }
  std::vector<int32_t> drafts(plan_.seqs.size(), 0);  // [plan]: what the proposer gave each sequence
  for (size_t i = 0; i < plan_.seqs.size(); ++i) {
    const ScheduledSeq& s = plan_.seqs[i];
    if (s.num_spec > 0) drafts[i] = acceptance_->Proposed(s.id, s.num_spec, s.seq->num_generated(), rng_);
  }
  result_ = Draw(plan_, drafts);
  timing_ = StepTiming{};
  const StepWork work = PlanWork(plan_, drafts);
  timing_.tokens = work.tokens;
  timing_.rows = work.rows;
  timing_.positions = work.positions;
  timing_.propose_seconds = RunDraft(plan_, candidates_);
  step_seconds_ = config_.target.Draw(work, jitter_rng_) + timing_.propose_seconds;
  if (speculation_ != nullptr) {
    timing_.seconds = step_seconds_;
    const double before = clock_.NowSeconds();
    speculation_->Observe(plan_, candidates_, result_, timing_);
    step_seconds_ += clock_.NowSeconds() - before;  // a shape measured between steps delays this one's outputs
  }
  in_step_ = true;
  step_start_s_ = now_s;
  return step_seconds_;
}

void Replica::End(double end_s) {
  in_step_ = false;
  if (plan_.seqs.empty()) return;  // a wait for the batching window
  const std::vector<SequenceState*> finished = scheduler_.Update(plan_, result_);
  for (const SeqOutput& o : result_.outputs) {
    const Seq* st = seqs_.at(o.id).get();
    SimRequestRecord& rec = records_[st->record];
    const int32_t kept = st->num_generated() - rec.output_tokens;
    if (kept <= 0) continue;
    if (rec.first_token_s < 0) {
      rec.first_token_s = end_s + config_.request_overhead_s;
      no_token_yet_.erase(no_token_yet_.find(rec.request.arrival_s));
      admission_.ObserveTtft(end_s, 1000.0 * (end_s - rec.request.arrival_s));
    }
    rec.output_tokens += kept;
    rec.message_s.push_back(end_s + config_.request_overhead_s);
  }
  for (const ScheduledSeq& s : plan_.seqs) {  // the draft's rollback to the target's KV
    Seq& seq = static_cast<Seq&>(*s.seq);
    if (s.num_spec > 0 && seq.status == SeqStatus::kRunning) seq.draft_computed = std::min(seq.draft_computed, seq.num_computed);
  }
  for (SequenceState* s : finished) Complete(s->id, end_s);
  const BlockManager& blocks = scheduler_.blocks();
  const int32_t used = blocks.num_blocks() - blocks.num_available();
  kv_block_seconds_ += used * (end_s - step_start_s_);
  kv_blocks_peak_ = std::max(kv_blocks_peak_, used);
  running_snapshot_ = scheduler_.num_running();
  oldest_queued_ms_ = no_token_yet_.empty() ? 0.0 : 1000.0 * (end_s - *no_token_yet_.begin());
  if (record_steps_) steps_.push_back({step_start_s_, end_s - step_start_s_, plan_, result_, used});
}

void Replica::Complete(RequestId id, double end_s) {
  const Seq& seq = *seqs_.at(id);
  SimRequestRecord& rec = records_[seq.record];
  rec.finish_s = end_s + config_.request_overhead_s;
  rec.preemptions = seq.num_preemptions;
  if (rec.first_token_s < 0) no_token_yet_.erase(no_token_yet_.find(rec.request.arrival_s));
  acceptance_->Forget(id);
  admission_.ObserveCompletion(end_s);
  seqs_.erase(id);
  --unfinished_;
}

}  // namespace specula

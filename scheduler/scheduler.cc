#include "scheduler/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specula {

absl::Status ValidateSchedulerConfig(const SchedulerConfig& c) {
  auto positive = [](int64_t v, const char* name) {
    return v > 0 ? absl::OkStatus()
                 : absl::InvalidArgumentError(absl::StrCat(name, " must be positive, got ", v));
  };
  for (auto st : {positive(c.max_num_seqs, "max_num_seqs"),
                  positive(c.max_num_batched_tokens, "max_num_batched_tokens"),
                  positive(c.block_size, "block_size"), positive(c.num_blocks, "num_blocks"),
                  positive(c.max_model_len, "max_model_len")}) {
    if (!st.ok()) return st;
  }
  if (c.max_wait_ms < 0) return absl::InvalidArgumentError("max_wait_ms must be >= 0");
  return absl::OkStatus();
}

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), blocks_(config.num_blocks, config.block_size, config.enable_prefix_caching) {}

absl::Status Scheduler::Check(const NewSequence& n) const {
  if (n.prompt.empty()) return absl::InvalidArgumentError(absl::StrCat("request ", n.id, ": empty prompt"));
  if (static_cast<int32_t>(n.prompt.size()) >= config_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("request ", n.id, ": prompt of ", n.prompt.size(),
                                                   " tokens is longer than the context of ",
                                                   config_.max_model_len, " tokens"));
  }
  if (n.max_new_tokens <= 0) return absl::InvalidArgumentError(absl::StrCat("request ", n.id, ": max_tokens must be positive"));
  const int32_t total = std::min<int64_t>(config_.max_model_len, n.prompt.size() + n.max_new_tokens);
  if (BlockManager::BlocksFor(total, config_.block_size) > config_.num_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", n.id, ": ", total, " tokens need more KV blocks than the pool has (",
        config_.num_blocks, " blocks of ", config_.block_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Add(NewSequence n, SequenceState* s) {
  if (absl::Status st = Check(n); !st.ok()) return st;
  s->id = n.id;
  s->priority = n.priority;
  s->arrival_order = next_arrival_++;
  s->arrival_ms = n.arrival_ms;
  s->num_prompt = static_cast<int32_t>(n.prompt.size());
  s->tokens = std::move(n.prompt);
  s->max_new_tokens = n.max_new_tokens;
  s->stop_ids = std::move(n.stop_ids);
  s->skip_prefix_cache = n.skip_prefix_cache;
  s->salt_root = n.salt_root;
  waiting_.push_back(s);
  return absl::OkStatus();
}

void Scheduler::SortByPolicy(std::vector<SequenceState*>* v) const {
  std::stable_sort(v->begin(), v->end(), [this](const SequenceState* a, const SequenceState* b) {
    return ServedBefore(config_.policy, *a, *b);
  });
}

double Scheduler::OldestWaitingArrival() const {
  double oldest = waiting_.front()->arrival_ms;
  for (const SequenceState* s : waiting_) oldest = std::min(oldest, s->arrival_ms);
  return oldest;
}

bool Scheduler::WindowOpen(double now_ms) const {
  if (config_.max_wait_ms <= 0 || waiting_.empty()) return true;
  if (static_cast<int32_t>(waiting_.size() + running_.size()) >= config_.max_num_seqs) return true;
  return now_ms - OldestWaitingArrival() >= config_.max_wait_ms;
}

void Scheduler::Preempt(SequenceState* s) {
  blocks_.Release(&s->blocks);
  s->num_computed = 0;
  s->block_hashes.clear();
  s->status = SeqStatus::kWaiting;
  ++s->num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), s));
  waiting_.push_back(s);
}

StepPlan Scheduler::Schedule(double now_ms) {
  StepPlan plan;
  int32_t budget = config_.max_num_batched_tokens;
  SortByPolicy(&running_);
  // 1. Running sequences, in policy order: decodes and the next chunk of unfinished prefills.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    SequenceState* s = running_[i];
    const int32_t pending = static_cast<int32_t>(s->tokens.size()) - s->num_computed;
    const bool decoding = pending == 1 && s->num_computed >= s->num_prompt;
    // A grammar's forced drafts take the first draft slots; the proposer fills the rest of its k.
    const int32_t max_spec = std::max(config_.num_spec_tokens, static_cast<int32_t>(s->forced.size()));
    const int32_t spec = decoding ? SpeculationLength(max_spec, *s, config_.max_model_len, budget) : 0;
    const int32_t n = std::min<int32_t>(pending + spec, budget);
    bool self_preempted = false;
    while (!blocks_.Reserve(&s->blocks, s->num_computed + n)) {
      SequenceState* victim = running_.back();  // served last by the policy
      plan.preempted.push_back(victim->id);
      Preempt(victim);
      if (victim == s) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // s was the last running sequence
    plan.seqs.push_back(
        {s->id, s->num_computed, n, s->num_computed + n - spec == static_cast<int32_t>(s->tokens.size()), spec, s});
    budget -= n;
    ++i;
  }
  // 2. Admit waiting sequences while budgets allow, unless this step had to preempt.
  SortByPolicy(&waiting_);
  const bool window_open = WindowOpen(now_ms);
  while (plan.preempted.empty() && window_open && !waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    SequenceState* s = waiting_.front();
    const int32_t len = static_cast<int32_t>(s->tokens.size());
    s->num_computed = s->skip_prefix_cache ? 0 : blocks_.MatchPrefix(s->tokens, len - 1, s->salt_root, &s->blocks);
    s->num_cached_prompt = std::min(s->num_computed, s->num_prompt);
    const int32_t n = std::min(len - s->num_computed, budget);
    if (!blocks_.Reserve(&s->blocks, s->num_computed + n)) {
      blocks_.Release(&s->blocks);  // keep FCFS order: nobody overtakes the head of the queue
      s->num_computed = 0;
      break;
    }
    waiting_.erase(waiting_.begin());
    s->status = SeqStatus::kRunning;
    running_.push_back(s);
    plan.seqs.push_back({s->id, s->num_computed, n, s->num_computed + n == len, 0, s});
    budget -= n;
  }
  if (plan.seqs.empty() && !window_open) {
    plan.wait_ms = config_.max_wait_ms - (now_ms - OldestWaitingArrival());
  }
  plan.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return plan;
}

std::vector<SequenceState*> Scheduler::Update(const StepPlan& plan, const StepResult& result) {
  std::vector<SequenceState*> finished;  // in this step
  std::unordered_map<RequestId, const SeqOutput*> outputs;
  for (const SeqOutput& o : result.outputs) outputs[o.id] = &o;
  for (const ScheduledSeq& sch : plan.seqs) {
    SequenceState* s = sch.seq;
    if (s->status != SeqStatus::kRunning) continue;  // failed meanwhile
    auto out = outputs.find(sch.id);
    const SeqOutput* o = out == outputs.end() ? nullptr : out->second;
    // KV is valid for the known tokens and the accepted drafts; the rejected drafts' slots are
    // given up by moving the watermark (nothing is copied).
    const int32_t accepted = sch.num_spec > 0 && o != nullptr ? static_cast<int32_t>(o->new_tokens.size()) - 1 : 0;
    s->num_computed = sch.start_pos + sch.num_tokens - sch.num_spec + accepted;
    FinishReason reason = FinishReason::kNone;
    if (o != nullptr) {
      for (TokenId t : o->new_tokens) {
        s->tokens.push_back(t);
        if (std::find(s->stop_ids.begin(), s->stop_ids.end(), t) != s->stop_ids.end()) {
          reason = FinishReason::kStopToken;
        } else if (s->num_generated() >= s->max_new_tokens ||
                   static_cast<int32_t>(s->tokens.size()) >= config_.max_model_len) {
          reason = FinishReason::kMaxTokens;
        }
        if (reason != FinishReason::kNone) break;  // tokens past a stop are dropped
      }
    }
    s->num_computed = std::min(s->num_computed, static_cast<int32_t>(s->tokens.size()));
    blocks_.Commit(s->tokens, s->num_computed, s->blocks, s->salt_root, &s->block_hashes);
    if (reason != FinishReason::kNone) {
      Finish(s, reason);
      finished.push_back(s);
    } else {
      // Lookahead slots back: those of rejected drafts, and those reserved for drafts the engine
      // chose not to propose (adaptive speculation lowers num_spec after Schedule).
      blocks_.Truncate(&s->blocks, static_cast<int32_t>(s->tokens.size()));
    }
  }
  return finished;
}

void Scheduler::Finish(SequenceState* s, FinishReason reason) {
  if (s->status == SeqStatus::kFinished) return;
  blocks_.Release(&s->blocks);
  for (auto* q : {&running_, &waiting_}) {
    auto pos = std::find(q->begin(), q->end(), s);
    if (pos != q->end()) q->erase(pos);
  }
  s->status = SeqStatus::kFinished;
  s->finish = reason;
}

absl::Status Scheduler::CheckInvariants() const {
  if (auto st = blocks_.CheckInvariants(); !st.ok()) return st;
  std::vector<int32_t> refs(blocks_.num_blocks(), 0);
  // A finished sequence's blocks would count here without a table holding them.
  for (const auto* q : {&running_, &waiting_}) {
    for (const SequenceState* s : *q) {
      for (BlockId b : s->blocks) ++refs[b];
      if (s->status == SeqStatus::kRunning &&
          static_cast<int32_t>(s->blocks.size()) * blocks_.block_size() < s->num_computed) {
        return absl::InternalError(absl::StrCat("request ", s->id, " has KV past its block table"));
      }
    }
  }
  for (BlockId b = 0; b < blocks_.num_blocks(); ++b) {
    if (refs[b] != blocks_.ref_count(b)) {
      return absl::InternalError(absl::StrCat("block ", b, ": ", refs[b], " tables hold it, ref count ",
                                              blocks_.ref_count(b)));
    }
  }
  if (static_cast<int32_t>(running_.size()) > config_.max_num_seqs) return absl::InternalError("too many running");
  return absl::OkStatus();
}

}  // namespace specula

// The iteration-level scheduler: each step it picks which sequences run and how many tokens each
// brings (chunked prefill mixed with decodes), within a token budget and a sequence budget, over
// the paged-KV block manager. Running out of blocks preempts (by recomputation) the sequence the
// policy serves last. Schedule() returns a plan and Update() applies the step's result; both are
// pure CPU code, tested with a fake model step.
#pragma once

#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/block_manager.h"
#include "scheduler/policy.h"
#include "core/sequence.h"

namespace specula {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t block_size = 16;
  int32_t num_blocks = 1024;
  int32_t max_model_len = 2048;  // prompt + generated tokens per sequence
  bool enable_prefix_caching = true;
  // Batching window: while fewer than max_num_seqs sequences could run, new arrivals wait up to
  // this long for company before their prefill starts. 0 = start at once.
  double max_wait_ms = 0.0;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // Speculative decoding: at most this many draft tokens per decoding sequence and step (0 = off).
  int32_t num_spec_tokens = 0;
};

absl::Status ValidateSchedulerConfig(const SchedulerConfig& c);

struct NewSequence {
  RequestId id = 0;
  std::vector<TokenId> prompt;
  int32_t max_new_tokens = 16;
  std::vector<TokenId> stop_ids;
  int32_t priority = 0;
  double arrival_ms = 0.0;
  bool skip_prefix_cache = false;  // compute every prompt position (prompt logprobs score them all)
  BlockHash salt_root = {};        // the prefix chain's root: shares blocks only with the same cache_salt
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  // Fills `s` (owned by the caller's request record, which keeps it until the sequence is finished)
  // from `seq` and queues it. Errors: empty prompt, a prompt that leaves no room in max_model_len,
  // or a request that could not fit in the whole KV pool even alone.
  absl::Status Add(NewSequence seq, SequenceState* s);
  // Add's checks alone: what Add would refuse `seq` with (a caller that adds it later checks first).
  absl::Status Check(const NewSequence& seq) const;
  StepPlan Schedule(double now_ms);
  // Applies the step: KV computed, new tokens appended, stop conditions. Returns the sequences that
  // finished in this step.
  std::vector<SequenceState*> Update(const StepPlan& plan, const StepResult& result);
  // Ends a sequence in any state (abort, stop string, error) and frees its blocks; the scheduler
  // holds no pointer to it afterwards.
  void Finish(SequenceState* s, FinishReason reason);
  bool HasUnfinished() const { return !waiting_.empty() || !running_.empty(); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const BlockManager& blocks() const { return blocks_; }
  // Between steps only: blocks computed elsewhere installed in the prefix cache, or the cache flushed.
  BlockManager& mutable_blocks() { return blocks_; }
  const SchedulerConfig& config() const { return config_; }
  // Room for no drafts from the next step on (adaptive speculation that found drafts cannot pay: no
  // lookahead slots reserved and given back every step).
  void StopSpeculation() { config_.num_spec_tokens = 0; }

  // Block ownership matches the sequences' tables, nothing leaked or owned twice. For tests.
  absl::Status CheckInvariants() const;

 private:
  void Preempt(SequenceState* s);
  bool WindowOpen(double now_ms) const;
  double OldestWaitingArrival() const;  // requires a waiting sequence
  void SortByPolicy(std::vector<SequenceState*>* v) const;

  SchedulerConfig config_;
  BlockManager blocks_;
  // The unfinished sequences, aliases of their owners' records.
  std::vector<SequenceState*> running_;
  std::vector<SequenceState*> waiting_;
  uint64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace specula

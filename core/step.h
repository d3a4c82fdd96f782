// What the scheduler and the engine exchange each step (ARCHITECTURE.md, "One step of the
// engine"). Pure data: ids and counts, never tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/batch.h"

namespace specula {

using RequestId = int64_t;
struct SequenceState;  // core/sequence.h

// One sequence's share of a step: tokens [start_pos, start_pos + num_tokens) of its sequence.
struct ScheduledSeq {
  RequestId id = 0;
  int32_t start_pos = 0;
  int32_t num_tokens = 0;
  // True when the last scheduled token is the sequence's last known token, so the step samples
  // the next one (a decode, or the final chunk of a prefill).
  bool samples = false;
  // Draft slots: num_tokens = 1 + num_spec for a speculative decode (the last known token, then up
  // to num_spec draft tokens that the proposer fills in).
  int32_t num_spec = 0;
  // The sequence's state, owned by the request's record (the engine's, or a simulated replica's),
  // valid for the step.
  SequenceState* seq = nullptr;
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  std::vector<RequestId> preempted;  // preempted by this Schedule() call (recomputed later)
  int32_t num_batched_tokens = 0;
  // When the plan is empty because the batching window is open: how long to wait for arrivals.
  double wait_ms = 0.0;

  // Lowers sequence i's draft slots to k <= seqs[i].num_spec (adaptive speculation chooses k after
  // the scheduler reserved room for the most); the scheduler takes the unused slots back in Update.
  void SetNumSpec(size_t i, int32_t k) {
    ScheduledSeq& s = seqs[i];
    num_batched_tokens -= s.num_spec - k;
    s.num_tokens -= s.num_spec - k;
    s.num_spec = k;
  }
};

// The engine's answer for one scheduled sequence: the tokens it appends (empty for a prefill
// chunk that does not reach the end of the prompt).
struct SeqOutput {
  RequestId id = 0;
  std::vector<TokenId> new_tokens;  // accepted drafts, then the recovered or bonus token
  int32_t num_drafts = 0;           // draft tokens actually verified (<= num_spec)
};

struct StepResult {
  std::vector<SeqOutput> outputs;
};

// Why a request ended; each surface's name for it is in request/finish.h's table.
enum class FinishReason { kNone, kStopToken, kStopString, kMaxTokens, kAborted, kError };

}  // namespace specula

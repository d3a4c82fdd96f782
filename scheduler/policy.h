// Scheduling policies, kept beside the scheduler core: the order in which sequences are served
// (and, reversed, preempted).
#pragma once

#include <algorithm>

#include "core/sequence.h"

namespace specula {

enum class SchedulingPolicy {
  kFcfs,      // first come, first served
  kPriority,  // lower `priority` first, FCFS among equals
};

// True when `a` is served before `b`. The victim of a preemption is the sequence served last, so
// the oldest (or most urgent) request always progresses and no request starves.
inline bool ServedBefore(SchedulingPolicy policy, const SequenceState& a, const SequenceState& b) {
  if (policy == SchedulingPolicy::kPriority && a.priority != b.priority) return a.priority < b.priority;
  return a.arrival_order < b.arrival_order;
}

// Speculation length for a decoding sequence this step: up to `max_k` drafts, but never more than
// the tokens it may still produce (the verifier adds one of its own), the room left in the context,
// or the step's remaining token budget. 0 means plain decoding.
inline int32_t SpeculationLength(int32_t max_k, const SequenceState& s, int32_t max_model_len, int32_t budget) {
  const int32_t len = static_cast<int32_t>(s.tokens.size());
  int32_t k = std::min(max_k, s.max_new_tokens - s.num_generated() - 1);
  k = std::min(k, max_model_len - len - 1);
  k = std::min(k, budget - 1);
  return std::max(k, 0);
}

}  // namespace specula

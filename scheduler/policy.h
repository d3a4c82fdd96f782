// Scheduling policies, kept beside the scheduler core: the order in which sequences are served
// (and, reversed, preempted).
#pragma once

#include "scheduler/sequence.h"

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

}  // namespace specula

// A fake model step for scheduler tests: no tensors. Every sequence that samples gets the token
// `token_of(id, position)`; a chosen (id, generated count) can emit the stop token.
#pragma once

#include <functional>

#include "scheduler/scheduler.h"

namespace specula::testing {

constexpr TokenId kStop = 2;

inline TokenId FakeToken(RequestId id, int32_t pos) { return static_cast<TokenId>(100 + (id * 7 + pos) % 50); }

// Runs Schedule + fake forward + Update. Returns the plan.
inline StepPlan FakeStep(Scheduler& s, double now_ms = 0.0) {
  StepPlan plan = s.Schedule(now_ms);
  StepResult result;
  for (const ScheduledSeq& q : plan.seqs) {
    if (q.samples) result.outputs.push_back({q.id, {FakeToken(q.id, q.start_pos + q.num_tokens)}});
  }
  s.Update(plan, result);
  return plan;
}

inline std::vector<TokenId> Prompt(int32_t n, int32_t salt = 0) {
  std::vector<TokenId> p(n);
  for (int32_t i = 0; i < n; ++i) p[i] = 10 + (i * 13 + salt) % 80;
  return p;
}

}  // namespace specula::testing

// A fake model step for scheduler tests: no tensors. Every sequence that samples gets the token
// `token_of(id, position)`; a chosen (id, generated count) can emit the stop token.
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "scheduler/scheduler.h"

namespace specula::testing {

// A scheduler whose sequences the test owns, as the engine's records own them.
class TestScheduler : public Scheduler {
 public:
  using Scheduler::Scheduler;
  absl::Status Add(NewSequence n) {
    if (seqs_.count(n.id)) return absl::AlreadyExistsError(absl::StrCat("request id ", n.id, " is already in use"));
    auto s = std::make_unique<SequenceState>();
    const RequestId id = n.id;
    if (auto st = Scheduler::Add(std::move(n), s.get()); !st.ok()) return st;
    seqs_.emplace(id, std::move(s));
    return absl::OkStatus();
  }
  SequenceState* Get(RequestId id) {
    auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : it->second.get();
  }
  void Finish(RequestId id, FinishReason reason) { Scheduler::Finish(Get(id), reason); }

 private:
  std::map<RequestId, std::unique_ptr<SequenceState>> seqs_;
};

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

// One simulated serving replica: the engine's step loop with the forward replaced by a step-time
// model. It runs the real scheduler (block manager, prefix cache, chunked prefill, preemption,
// priorities), the real admission control and the real adaptive-speculation controller, in the
// order Engine::Step calls them (engine/engine.cc), so that the schedule it produces is the
// engine's for the same arrivals, step times and acceptances (tests/sim/same_schedule_test.cc).
//
// A step is Begin (schedule, choose k, draw acceptances, price the step) at its start time and End
// (the scheduler's update, outputs, completions) at its end; arrivals in between wait for the next
// Begin, as the engine loop adds requests between steps.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/step.h"
#include "scheduler/admission.h"
#include "scheduler/scheduler.h"
#include "sim/acceptance.h"
#include "sim/step_time.h"
#include "spec/adaptive.h"

namespace specula {

struct SimRequest {
  int64_t id = 0;
  double arrival_s = 0;
  int32_t prompt_len = 0, output_len = 0;
  int64_t session = -1;       // -1: none (routing by session affinity needs one)
  int32_t shared_prefix = 0;  // leading prompt tokens equal to the session's earlier prompts
  int64_t prompt_id = -1;     // requests with the same id send the same prompt (-1: a prompt of its own)
  int32_t priority = 0;
  DraftProfile drafts;  // what an n-gram lookup found at each decode step (a trace's; empty: none)
  bool text_prompt = true;  // sent as text (the server tokenizes it), else as token ids
};

struct ReplicaConfig {
  SchedulerConfig scheduler;  // num_spec_tokens: k (fixed) or the most auto may choose
  AdmissionConfig admission;
  bool speculate = false;     // drafts at all
  bool adaptive = false;      // --num-spec-tokens auto
  ForwardShape target_shape;
  std::optional<ForwardShape> draft_shape;  // a draft model (else a proposer without one: n-gram, suffix)
  StepTimeModel target;
  StepTimeModel draft;                     // used when draft_shape is set
  double propose_seconds_per_seq = 0;      // host time of a proposer without a model, per drafting sequence
  // As SpecConfig's: cost tables to use instead of the simulated measurement, and whether step
  // times refine them (fixed tables make the engine's choices reproducible, for comparing them).
  std::optional<std::vector<CostPoint>> target_cost, draft_cost;
  bool refine_cost = true;
  // A request's time outside the steps (waking the idle loop, adding it, delivering its tokens to
  // the client): its tokens are seen this long after their step ends.
  double request_overhead_s = 0;
  // A request that arrives while a step runs delays that step's end by this much: on a host whose
  // cores all run the forward, the client's thread submitting it takes one of them for a while
  // (tokenizing a text prompt, or passing token ids on).
  double arrival_s = 0, arrival_token_ids_s = 0;
};

// What happened to one request, in the simulation's seconds.
struct SimRequestRecord {
  SimRequest request;
  std::string refused;        // admission's reason; empty if admitted
  double first_token_s = -1;  // -1: none yet (as the client sees it: request_overhead_s after the step)
  double finish_s = -1;
  int32_t output_tokens = 0;
  std::vector<double> message_s;  // when each step that gave it tokens ended (its streamed messages)
  int32_t preemptions = 0;
};

// A step as it ran, for tests that compare schedules and for the trace.
struct SimStep {
  double start_s = 0, seconds = 0;
  StepPlan plan;          // after the choice of k
  StepResult result;
  int32_t kv_blocks_used = 0;
};

class Replica {
 public:
  // `acceptance` must outlive the replica; `seed` drives its prompts, tokens and acceptances.
  Replica(ReplicaConfig config, AcceptanceModel* acceptance, uint64_t seed);

  // Admission at `now_s`. Returns the refusal reason, or "" when queued for the next step.
  std::string Submit(const SimRequest& r, double now_s);
  // Starts a step at `now_s`: returns its duration, or nullopt when there is nothing to run.
  std::optional<double> Begin(double now_s);
  // Ends the step begun last, at `end_s`.
  void End(double end_s);

  bool busy() const { return in_step_; }
  // How much later the step in flight ends than Begin said (arrivals during it), and no more after.
  double TakeDelay() { return std::exchange(delay_s_, 0.0); }
  bool has_work() const { return !pending_.empty() || scheduler_.HasUnfinished(); }
  int32_t outstanding() const { return static_cast<int32_t>(pending_.size()) + unfinished_; }
  const Scheduler& scheduler() const { return scheduler_; }
  const std::vector<SimRequestRecord>& records() const { return records_; }
  std::vector<SimRequestRecord>& mutable_records() { return records_; }
  // Every step (kept only when record_steps is set: tests and traces).
  void set_record_steps(bool on) { record_steps_ = on; }
  const std::vector<SimStep>& steps() const { return steps_; }
  int64_t num_steps() const { return num_steps_; }
  const std::vector<int64_t>& k_histogram() const { return k_histogram_; }
  int64_t draft_tokens() const { return draft_tokens_; }  // drafts verified, and of those accepted
  int64_t accepted_tokens() const { return accepted_tokens_; }
  double kv_block_seconds() const { return kv_block_seconds_; }  // integral of used blocks over time
  int32_t kv_blocks_peak() const { return kv_blocks_peak_; }
  bool drafts_cannot_pay() const { return speculation_ != nullptr && speculation_->drafts_cannot_pay(); }

 private:
  struct Seq : SequenceState {  // an admitted request's simulation state, its core part the scheduler's
    size_t record = 0;
    int32_t draft_computed = 0;  // tokens the draft model has run (its KV)
    SpecAcceptance acceptance;   // adaptive speculation's estimate of its acceptance
  };
  std::vector<TokenId> Prompt(const SimRequest& r);
  void AddPending();
  std::vector<SpecCandidate> Candidates(const StepPlan& plan);
  // The draft's forwards for the plan's chosen k (advancing each sequence's draft KV), or a proposer
  // without a model's host time: the step's drafting seconds.
  double RunDraft(const StepPlan& plan, absl::Span<const SpecCandidate> c);
  StepResult Draw(const StepPlan& plan, const std::vector<int32_t>& drafts);
  void Complete(RequestId id, double end_s);

  ReplicaConfig config_;
  AcceptanceModel* acceptance_;
  std::mt19937_64 rng_;
  std::mt19937_64 jitter_rng_;  // step-time variation (its own stream: the acceptance draws stay the same)
  ManualClock clock_;  // adaptive speculation's: advanced by the time its measurements take
  Scheduler scheduler_;
  Admission admission_;
  std::unique_ptr<AdaptiveSpeculation> speculation_;
  std::vector<SimRequestRecord> records_;
  std::unordered_map<RequestId, std::unique_ptr<Seq>> seqs_;  // the admitted requests' one owner
  std::vector<size_t> pending_;  // records submitted, not yet in the scheduler
  std::unordered_map<int64_t, std::vector<TokenId>> sessions_;  // a session's last prompt
  int32_t unfinished_ = 0;
  // What the server's admission reads, as of the last step's end (EngineLoop's snapshot).
  int32_t running_snapshot_ = 0;
  double oldest_queued_ms_ = 0;
  std::multiset<double> no_token_yet_;  // arrival times of admitted requests without a token yet
  // The step in flight.
  bool in_step_ = false;
  double step_start_s_ = 0, step_seconds_ = 0;
  double delay_s_ = 0;  // arrival_s per request submitted during the step in flight
  StepPlan plan_;
  int64_t draft_tokens_ = 0, accepted_tokens_ = 0;
  std::vector<SpecCandidate> candidates_;
  StepResult result_;
  StepTiming timing_;
  bool record_steps_ = false;
  std::vector<SimStep> steps_;
  int64_t num_steps_ = 0;
  std::vector<int64_t> k_histogram_;
  double kv_block_seconds_ = 0;
  int32_t kv_blocks_peak_ = 0;
};

}  // namespace specula

// The engine step loop: Scheduler::Schedule -> model forward over the batch -> sampling ->
// Scheduler::Update. Requests are added and aborted between steps; each finishes with a reason
// and per-token timings.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "draft/proposer.h"
#include "engine/spec_controller.h"
#include "model/llama_model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "scheduler/scheduler.h"
#include "verify/rejection_sampler.h"

namespace specula {

struct Request {
  RequestId id = 0;
  std::vector<TokenId> prompt;
  int32_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<TokenId> stop_ids;         // in addition to the tokenizer's EOS unless ignore_eos
  std::vector<std::string> stop_strings;  // needs a tokenizer
  bool ignore_eos = false;
  int32_t priority = 0;
};

struct RequestOutput {
  RequestId id = 0;
  std::vector<TokenId> tokens;  // generated
  std::string text;             // generated text (stop string cut off), when a tokenizer is set
  FinishReason finish = FinishReason::kNone;
  std::string error;
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int32_t num_preemptions = 0;
  // Milliseconds since the engine started. scheduled_ms: the step that first scheduled it (it left
  // the waiting queue; 0: never).
  double arrival_ms = 0, scheduled_ms = 0, first_token_ms = 0, finish_ms = 0;
  std::vector<double> token_ms;  // [tokens]

  SpecStats spec;  // drafts, draft tokens, accepted tokens, accepted per position

  double ttft_ms() const { return first_token_ms - arrival_ms; }
  double tpot_ms() const {
    return tokens.size() > 1 ? (token_ms.back() - token_ms.front()) / (tokens.size() - 1) : 0.0;
  }
};

struct SpecConfig {
  Proposer* proposer = nullptr;  // null: no speculation. Must outlive the engine.
  // Synthetic acceptance for cost studies: each draft is accepted with this probability instead
  // of being verified. NOT lossless; refused unless allow_synthetic (benchmarks, experiments).
  double synthetic_alpha = -1.0;
  bool allow_synthetic = false;
  // --num-spec-tokens auto: each step, k drafts per decoding sequence, 0 <= k <= the scheduler's
  // num_spec_tokens, chosen for the most expected tokens per second (engine/spec_controller.h).
  // The engine measures forwards of the target of 1 to 8 tokens and the draft's forward of one
  // token when it is built. If no acceptance would make drafts pay (EngineStats::drafts_cannot_pay)
  // auto runs without them from then on. Otherwise the draft's forwards of up to 8 tokens are
  // measured, for batches of up to 8 sequences the target's forward of twice the batch (one draft
  // each) too, and the larger ones (up to 512 tokens) between steps, one shape at a time, while
  // the time spent measuring stays under 0.5% of the time spent in steps: a short job pays ~1% for
  // it, however large the models. Until a size is measured, auto does not choose steps past about
  // twice the largest measured one. Every step's timings refine the model (a factor). A shape
  // longer than calibration_seconds is not measured.
  bool adaptive = false;
  double calibration_seconds = 1.0;
  // Startup measurements to use instead of measuring (the draft's ignored for proposers without a
  // model), and whether step timings refine them: fixed costs make the choices reproducible, for
  // tests and cost studies.
  std::optional<std::vector<CostPoint>> target_cost = std::nullopt, draft_cost = std::nullopt;
  bool refine_cost = true;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;  // prompt (and recomputed) tokens run through the model
  int64_t decode_tokens = 0;
  int64_t generated_tokens = 0;
  SpecStats spec;
  // Speculation lengths: decoding sequence-steps by the number of drafts they were given
  // ([num_spec_tokens + 1]), and the steps with decoding sequences, of which spec_off_steps gave
  // none any drafts.
  std::vector<int64_t> spec_k_histogram;
  int64_t decode_steps = 0;
  int64_t spec_off_steps = 0;
  // Adaptive speculation's cost measurement: seconds spent measuring forwards (at startup and
  // between steps), and the largest target forward measured so far, in tokens.
  double cost_measure_seconds = 0;
  int32_t cost_measured_tokens = 0;
  // The startup measurement found that no acceptance would make drafts pay (the draft costs about
  // as much as the target): auto runs without drafts, its controller and later measurements off.
  bool drafts_cannot_pay = false;
};

class Engine {
 public:
  // `model` and `tokenizer` (may be null: no stop strings, no text) must outlive the engine.
  // config.num_blocks and max_model_len are used as given; the KV pool is allocated here.
  Engine(LlamaModel* model, const Tokenizer* tokenizer, const SchedulerConfig& config, SpecConfig spec = {});
  // Errors: synthetic acceptance without allow_synthetic, speculation without a proposer.
  absl::Status Validate() const;

  absl::Status AddRequest(Request r);
  // Runs one step and returns the requests that finished in it.
  std::vector<RequestOutput> Step();
  void Abort(RequestId id);
  bool HasUnfinished() const { return scheduler_.HasUnfinished(); }
  // The output so far of an unfinished request (streaming), or null.
  const RequestOutput* Peek(RequestId id) const {
    auto it = active_.find(id);
    return it == active_.end() ? nullptr : &it->second.out;
  }
  const Scheduler& scheduler() const { return scheduler_; }
  const EngineStats& stats() const { return stats_; }
  double NowMs() const;

 private:
  struct Active {
    Request request;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<Uniform> uniform;  // verification randomness
    RequestOutput out;
  };
  RequestOutput Complete(RequestId id, FinishReason reason);
  // Verifies one sequence's drafts against its logit rows [1 + drafts, vocab]: accepted tokens then
  // a recovered or bonus token. Touches only `a` and per-thread scratch: sequences are verified in
  // parallel.
  VerifyResult VerifyDrafts(Active& a, const SequenceState& st, const Proposal& draft, const float* rows);
  // Measures the target's and the draft's small forwards for adaptive speculation.
  absl::Status Calibrate();
  // After a step of `step_seconds`: measures the next larger shape of the target or the draft if
  // the measuring time so far stays within its share of the steps' time.
  void CalibrateMore(double step_seconds);
  // The drafts each speculating sequence of the plan gets (lowering num_spec under adaptive
  // speculation), recorded in the stats. `candidates` receives those sequences, `index` their plan
  // indices.
  void ChooseSpeculation(StepPlan* plan, std::vector<SpecCandidate>* candidates, std::vector<size_t>* index);

  LlamaModel* model_;
  const Tokenizer* tokenizer_;
  Scheduler scheduler_;
  KvCache kv_;
  std::unordered_map<RequestId, Active> active_;
  std::vector<RequestOutput> aborted_;  // returned by the next Step()
  std::vector<float> logits_;           // [num_seqs, vocab]
  std::vector<TokenId> sampled_;        // [num_seqs]: the step's tokens of rows without drafts
  std::vector<VerifyResult> verified_;  // [num_seqs]: the step's verifications of sequences with drafts
  EngineStats stats_;
  SpecConfig spec_;
  std::unique_ptr<SpecController> controller_;  // adaptive speculation
  absl::Status calibration_;
  // Lazy measurement of one model's forwards: the largest shape measured so far and its time.
  struct Meter {
    int32_t tokens = 0;
    double seconds = 0;
    bool done = true;  // nothing more to measure (or the costs were given)
    // The largest of `points` (in order of work), more to measure; none: done.
    static Meter Of(const std::vector<CostPoint>& points) {
      return points.empty() ? Meter{} : Meter{points.back().tokens, points.back().seconds, false};
    }
  };
  Meter target_meter_, draft_meter_;
  // Measures m's next shape and gives the controller the larger table; false: nothing more to measure.
  bool MeasureNext(Meter* m);
  CostGrid grid_;
  double step_seconds_ = 0, calibration_seconds_ = 0;  // time in steps, and measuring between steps
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace specula

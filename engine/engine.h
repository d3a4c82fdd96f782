// The engine's step loop, as the architecture gives it: schedule -> choose k -> propose -> forward
// -> verify -> update, and the step's per-request deltas from the output processor. Requests are
// added and aborted between steps; each finishes with a reason and per-token timings.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "constrain/forced_spellings.h"
#include "core/clock.h"
#include "draft/proposer.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "engine/request_record.h"
#include "kvstore/kv_transfer.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"
#include "model/sampler.h"
#include "scheduler/scheduler.h"
#include "spec/adaptive.h"
#include "tokenizer/tokenizer.h"
#include "verify/rejection_sampler.h"
#include "verify/step_verifier.h"

namespace specula {

struct SpecConfig {
  Proposer* proposer = nullptr;  // null: no speculation. Must outlive the engine.
  // Synthetic acceptance for cost studies: each draft is accepted with this probability instead
  // of being verified. NOT lossless; refused unless allow_synthetic (benchmarks, experiments).
  double synthetic_alpha = -1.0;
  bool allow_synthetic = false;
  // --num-spec-tokens auto: each step, k drafts per decoding sequence, 0 <= k <= the scheduler's
  // num_spec_tokens, chosen for the most expected tokens per second (spec/adaptive.h, which says
  // what it measures and when). If no acceptance would make drafts pay
  // (EngineStats::drafts_cannot_pay) auto runs without them from then on. A shape longer than
  // calibration_seconds is not measured.
  bool adaptive = false;
  double calibration_seconds = 1.0;
  // Structured output: the most drafts per step that a constrained sequence's grammar forces (its
  // one allowed continuation), in steps where the proposer has none, or without a proposer (0: none).
  int32_t grammar_drafts = 8;
  // Startup measurements to use instead of measuring (the draft's ignored for proposers without a
  // model), and whether step timings refine them: fixed costs make the choices reproducible, for
  // tests and cost studies.
  std::optional<std::vector<CostPoint>> target_cost = std::nullopt, draft_cost = std::nullopt;
  bool refine_cost = true;
  // Where the step's tokens are chosen, plain samples and verifications alike: on the host from
  // copied logits, or where the logits are, by the backend's Argmax, Sample and VerifyDrafts
  // (verify/backend_verify.h: only token ids come back). kAuto: the backend when it is a device.
  enum class VerifyOn { kAuto, kHost, kBackend };
  VerifyOn verify_on = VerifyOn::kAuto;
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
  // Structured output: rows masked, and the seconds spent filling and applying their masks.
  int64_t constrained_rows = 0;
  double constraint_mask_seconds = 0;
  // Shared KV (--kv-store): the store's counters (kvstore/kv_transfer.h), and the blocks installed
  // from it, refused (checksum, tokens or size), and the seconds spent installing them.
  KvStoreStats kv_store;
  int64_t kv_installed_blocks = 0, kv_rejected_blocks = 0;
  double kv_install_seconds = 0;
};

class Engine {
 public:
  // `model` and `tokenizer` (may be null: no stop strings, no text) must outlive the engine.
  // config.num_blocks and max_model_len are used as given; the KV pool is allocated here. `clock`
  // (null: the steady clock; else it must outlive the engine) times requests, steps and the
  // batching window's waits.
  Engine(LlamaModel* model, const Tokenizer* tokenizer, const SchedulerConfig& config, SpecConfig spec = {},
         Clock* clock = nullptr);
  // Errors: synthetic acceptance without allow_synthetic, speculation without a proposer.
  absl::Status Validate() const;

  // Errors name the request and the field (ValidateRequest, Scheduler::Add).
  absl::Status AddRequest(Request r);
  // Checks and compiles a request's constraint (constrain/), from any thread: serving calls it on its
  // handler threads, so that compiling never holds up a step. Refused by name without a tokenizer.
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> CompileConstraint(const RequestSpec& spec) const;
  // Runs one step and returns a delta for every request that produced tokens or finished in it
  // (an aborted request's last delta comes from the next step).
  std::vector<RequestDelta> Step();
  void Abort(RequestId id);
  bool HasUnfinished() const {
    return scheduler_.HasUnfinished() || !aborted_.empty() || !store_.fetches.empty() || !store_.held.empty();
  }
  // Shares full KV blocks through a store (--kv-store): a request's prompt blocks missing here are
  // fetched before it is scheduled, and blocks are written as they are committed, each request's
  // before its last delta. `replica_salt` holds everything that changes a block's bits (weights,
  // dtypes, block size and layout, kernels). Errors: a pool the host cannot copy (a device's).
  absl::Status AttachKvStore(std::unique_ptr<KvTransfer> transfer, const std::string& replica_salt);
  // Forgets every locally cached prefix block (POST /reset_prefix_cache); returns how many.
  int32_t ResetPrefixCache();
  const Scheduler& scheduler() const { return scheduler_; }
  const EngineStats& stats() const { return stats_; }
  double NowMs() const;
  // The calling thread hands the engine's steps to another thread from now on: it releases the
  // OpenMP worker threads it started (the forwards it ran: loading, warm-up, cost measurement). Left
  // idle, they still count against the cores, so libgomp stops its workers spinning between
  // parallel regions and every region of every step waits on a futex wake.
  void HandOffThreads();
  // With adaptive speculation: measures now the forward shapes it would measure between later
  // steps (AdaptiveSpeculation::MeasureRemaining), so that a timed run's steps carry none of them.
  void MeasureSpeculationCosts();
  // Called in every step that ran, with its plan (k chosen), its result and when it began (the
  // clock's seconds), after the scheduler's update: how a test compares the engine's schedule with
  // the simulator's (sim/replica.h), and how a calibration times served steps.
  using StepObserver = std::function<void(const StepPlan&, const StepResult&, double start_s)>;
  void set_step_observer(StepObserver f) { step_observer_ = std::move(f); }

 private:
  // The step's drafts: per plan index, the proposal's index or SIZE_MAX.
  struct Drafts {
    std::vector<Proposal> proposals;
    std::vector<size_t> index;   // [plan.seqs]
    std::vector<int32_t> forced;  // [proposals]: its tokens are the grammar's forced ones (this many), or the proposer's
    std::vector<int32_t> cut;     // [proposals]: the proposer's drafts cut where they left the grammar
    double seconds = 0;           // in the proposer
  };
  // The step's forward: each sequence's first logits row, the logits, and the work as it ran.
  struct Ran {
    std::vector<int32_t> row_of;      // [plan.seqs]: the row of the first token chosen
    std::vector<int32_t> prompt_row;  // [plan.seqs]: a chunk's first row when it scores its prompt, else -1
    std::vector<TokenId> fed;         // [fed tokens]: each speculating sequence's last token, then its drafts
    std::vector<float> logits;        // [rows, vocab] on the host; empty when they stay in the backend
    // Logits kept in the backend: constrained sequences' rows, copied to the host and masked there.
    std::vector<float> masked;        // [masked rows, vocab]
    std::vector<int32_t> masked_row;  // [rows]: a row's place in `masked`, or -1 (empty: none)
    StepTiming timing;
  };
  // The step's verification: the tokens, and their scores for requests that ask.
  struct Verified {
    StepResult result;                                       // [sampling sequences]
    std::vector<std::vector<TokenLogprobs>> logprobs;        // [plan.seqs][its tokens]
    std::vector<std::vector<TokenLogprobs>> prompt_logprobs; // [plan.seqs][prompt positions scored]
  };
  // What a step brings the outputs: per request, its record and its update.
  struct StepOutputs {
    std::vector<RequestRecord*> records;  // [updates]
    std::vector<OutputUpdate> updates;
    StepResult keep;  // the tokens the updates' spans point into
  };

  // The stages of a step (Step reads as the architecture's loop); each returns what the next takes.
  StepPlan Schedule();
  std::vector<SpecCandidate> Candidates(const StepPlan& plan) const;
  Drafts Propose(const StepPlan& plan);
  // A constrained sequence's proposal (`at` in d) cut where it leaves the grammar; none left, up to
  // `slots` of the tokens its grammar forces instead (engine/engine_drafts.cc).
  void AddForcedDrafts(RequestRecord& r, int32_t slots, size_t at, Drafts* d);
  absl::StatusOr<Ran> Forward(const StepPlan& plan, const Drafts& drafts);
  // Structured output (engine/engine_drafts.cc): masks each constrained sequence's rows, its
  // sampling row and one per draft, by its grammar at each row's position.
  absl::Status ConstrainLogits(const StepPlan& plan, const Drafts& drafts, Ran* ran);
  // Rows [row_of[i], + n) of the step's logits where they can be masked: in place on the host, or
  // copied from the backend into ran->masked. [n, vocab].
  absl::StatusOr<absl::Span<float>> MaskableRows(size_t i, size_t n, Ran* ran);
  // Each constrained sequence's matcher follows the step's tokens (after the scheduler's update),
  // and the tokens its grammar forces next become its forced drafts.
  void FollowConstraints(const StepPlan& plan, const StepResult& result);
  // The tokens r's grammar forces from where its matcher is, as the model spells them (the matcher
  // walks them and comes back).
  std::vector<TokenId> ForcedDrafts(RequestRecord& r) const;
  absl::StatusOr<Verified> Verify(const StepPlan& plan, const Drafts& drafts, const Ran& ran);
  StepOutputs Update(const StepPlan& plan, Verified verified, const Drafts& drafts);
  // The outputs' one call: the step's updates after those of requests aborted since the last step;
  // then requests that ended are finished everywhere and their records dropped.
  std::vector<RequestDelta> Publish(StepOutputs step);

  // The step's logprobs (engine/logprobs.h): each chosen token's for requests that ask, and the
  // prompt tokens a chunk scored.
  absl::Status Score(const StepPlan& plan, const Ran& ran, Verified* v);
  // One row of the step's logits, wherever they are: [vocab]. `scratch` holds a row copied from the
  // backend.
  absl::StatusOr<absl::Span<const float>> LogitsRow(const Ran& ran, int32_t row, std::vector<float>* scratch) const;
  // Rows [row, row + n) as ConstrainLogits masked them on the host from a backend's logits, or
  // empty (they are read where they are). [n, vocab].
  absl::Span<const float> MaskedRows(const Ran& ran, int32_t row, size_t n) const;
  // Whether a sequence's chunk scores prompt tokens not yet scored.
  static bool ScoresPrompt(const ScheduledSeq& s);

  // Counts the step's decoding sequences by the drafts they were given.
  void CountSpeculation(const StepPlan& plan, absl::Span<const SpecCandidate> candidates);
  // The adaptive speculation's measurement counters into stats_.
  void CopyCostStats();
  // Shared KV (engine/engine_kv_store.cc). AddRequest's: whether `n` waits for a fetch of its
  // prompt's blocks (then it is kept in r's slot, not given to the scheduler).
  bool FetchFirst(RequestRecord& r, NewSequence& n);
  // Each finished fetch's blocks installed in the prefix cache, and its request given to the scheduler.
  void InstallFetched();
  int32_t InstallBlocks(RequestRecord& r, absl::Span<const std::string> values);
  // Blocks the step committed, copied out and queued for the store; `tables` are the sequences'
  // block tables from before the scheduler's update (a finished sequence's are released by then,
  // their contents intact until the next schedule). [plan.seqs][blocks]
  void StoreCommitted(const StepPlan& plan, const std::vector<std::vector<BlockId>>& tables);
  // A finished request's last delta waits until its writes are done (the next turn must find them).
  void HoldUntilStored(std::vector<RequestDelta>* deltas);
  std::string StoreKey(const BlockHash& h) const { return store_.key_prefix + h.Hex(); }

  // Fails the step's requests (a forward that failed: a bug or corrupt state), keeping the rest.
  StepOutputs FailStep(const StepPlan& plan, const absl::Status& status);

  LlamaModel* model_;
  const Tokenizer* tokenizer_;
  Scheduler scheduler_;
  KvCache kv_;
  OutputProcessor outputs_;
  // Every request's record, from AddRequest until its last delta: the one owner of per-request state.
  absl::flat_hash_map<RequestId, std::unique_ptr<RequestRecord>> records_;
  std::vector<RequestId> aborted_;  // aborted between steps, their last delta due from the next step
  StepVerifier verifier_;
  // Structured output: the compiler, made on first use (its vocabulary copy costs ~25 ms), and one
  // row's mask, [MaskWords(vocab)].
  mutable std::once_flag constraints_once_;
  mutable std::unique_ptr<ConstraintCompiler> constraints_;
  std::vector<uint32_t> mask_;
  // How the model spells forced strings, learned where forced drafts were refused (engine-wide).
  ForcedSpellings spellings_;
  std::vector<float> spare_logits_;  // capacity only: the last step's logits buffer, for the next Forward
  EngineStats stats_;
  SpecConfig spec_;
  std::unique_ptr<AdaptiveSpeculation> speculation_;  // --num-spec-tokens auto
  absl::Status calibration_;
  Clock* const clock_;
  const double start_s_;  // the clock's time when the engine started
  StepObserver step_observer_;
  // Shared KV (--kv-store); transfer null: off.
  struct KvSharing {
    std::unique_ptr<KvTransfer> transfer;
    std::string key_prefix;                            // "specula:kv:<replica salt hash>:"
    absl::flat_hash_map<uint64_t, RequestId> fetches;  // fetch ticket -> the request waiting on it
    std::vector<RequestDelta> held;                    // last deltas waiting for their writes
    absl::flat_hash_set<BlockHash> known;              // blocks the store has (written or fetched), bounded
    int64_t failures_seen = 0;                         // the store's errors + timeouts when `known` was last trusted
  } store_;
};

}  // namespace specula

// The serving core that the gRPC and HTTP front ends share: admission control, drain, metrics, and
// the engine loop; requests are checked by the request boundary (request/boundary.h) under the row
// of the surface they came from. No gRPC or HTTP types here: a front end turns its wire format into
// a ServeRequest and a RequestStream's deltas back into its own.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "request/boundary.h"
#include "request/request_spec.h"
#include "scheduler/admission.h"
#include "serving/engine_loop.h"
#include "serving/faq.h"
#include "serving/metrics.h"
#include "serving/model_bundle.h"
#include "serving/replica.h"

namespace specula {

struct ServeOptions {
  std::string model_name;  // the served model's name (--model as given)
  int32_t default_max_tokens = kMaxTokensFlagDefault;  // --max-tokens: the table's configured default
  AdmissionConfig admission;
  // Each finished request's speculative-decoding metrics in its response (on unless
  // --per-request-spec-decode-metrics none; nothing for a request without drafts on a server without
  // a proposer).
  bool spec_metrics = true;
  // The server shares KV through a store (--kv-store): each response carries its request's fetch and
  // install times (OpenAI: metrics.kv_store; gRPC: kv_store).
  bool kv_store = false;
  // Which replica this is (--replica-id): X-Specula-Replica on every HTTP response, x-specula-replica
  // in every Generation call's initial metadata, /metrics' replica_info. Empty: none of them.
  std::string replica_id;
  // What a request that admission control refuses gets (--degrade): without a table, the refusal
  // (RESOURCE_EXHAUSTED: HTTP 429); with one (--degrade faq), the answer `faq` has for its question
  // when one matches (Generation::answered_by "faq"), else the same refusal. Either way it is
  // counted by its reason and path (ServingMetrics::OnDegraded).
  std::shared_ptr<const FaqTable> faq;
};

// One request as a front end parsed it: its spec (max_tokens 0: the surface's default; seed unset:
// the engine request's id) and its prompt, text or token ids. `surface` picks the row of the table
// it is checked under, and with it how fields are named in errors (gRPC's `sampling.` prefix).
struct ServeRequest : RequestSpec {
  std::string prompt;
  bool templated = false;  // `prompt` is a rendered chat template: it carries its own BOS
  std::vector<TokenId> prompt_token_ids;
  Surface surface = Surface::kInProcess;
  // The question --degrade faq matches: a chat's last user message, a completion's text prompt.
  // Empty: nothing to match (a prompt of token ids).
  std::string faq_query;
};

// The prompt of a ServeRequest as NormalizeRequest takes it: its text unless empty, or its ids.
PromptInput ServePrompt(const ServeRequest& r);

class Server;

// One admitted call: its n samples, each a request of its own. With n > 1 sample 0 runs first and
// the others are submitted once it has a token (by the engine loop, whether or not anyone reads):
// its prompt's full blocks are then in the prefix cache, so the prompt's KV is computed once (each
// sample recomputes only the last, partial block, as in vLLM). Events come in each sample's order;
// thread-safe.
class Generation : public std::enable_shared_from_this<Generation> {
 public:
  ~Generation();  // cancels the samples still running
  struct Event {
    int32_t index;  // the sample
    RequestDelta delta;
  };
  // The next event, waiting at most `timeout`; nullopt if none came by then, or after the last.
  std::optional<Event> Next(std::chrono::milliseconds timeout);
  // Called after each delta arrives (on the engine loop's thread: return quickly, never block; it
  // may call Next), and once at once if events are waiting.
  void SetListener(std::function<void()> listener);
  // Aborts every sample (their KV is free after the next step); each still ends with a last delta.
  void Cancel();
  int32_t n() const { return static_cast<int32_t>(ids_.size()); }
  RequestId id() const { return ids_[0]; }  // sample 0's
  const std::vector<TokenId>& prompt() const { return prompt_; }
  int32_t spec_metrics_tokens() const;  // Server::spec_metrics_tokens
  bool kv_store_metrics() const;        // ServeOptions::kv_store
  // Which path answers: "model" (the engine), or "faq" (the degrade path's table, whose answer is
  // each sample's one delta, ready at once).
  const char* answered_by() const { return answered_by_; }
  // The model it was admitted to: its version names the answer, its tokenizer decodes it.
  const ModelBundle& bundle() const { return *bundle_; }
  const std::string& model_version() const { return bundle_->version; }

 private:
  friend class Server;
  Generation(Server* server, std::shared_ptr<const ModelBundle> bundle, std::vector<Request> requests);
  // Answered without the engine: each sample's last delta given (`answered_by` names the path).
  Generation(Server* server, std::shared_ptr<const ModelBundle> bundle, std::vector<TokenId> prompt,
             std::vector<RequestDelta> answers, const char* answered_by);
  // Submits samples [submitted, n) (mu_ held) and returns their streams, whose listeners Listen
  // sets once mu_ is released (a listener may run at once, and it takes mu_). Never from Next.
  std::vector<std::shared_ptr<RequestStream>> SubmitUpTo(size_t n);
  void Listen(const std::vector<std::shared_ptr<RequestStream>>& streams);
  void Notify();

  Server* const server_;
  const std::shared_ptr<const ModelBundle> bundle_;
  std::vector<TokenId> prompt_;
  std::vector<Request> requests_;  // [n] (none when answered without the engine): what each sample
                                   // submits (moved out when it does)
  std::vector<RequestId> ids_;     // [n]
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<RequestStream>> streams_;  // [submitted samples]
  // Last deltas no stream carries, for the samples [n - size, n): samples cancelled before they were
  // submitted, or every sample of an answer made without the engine.
  std::vector<RequestDelta> ready_;
  const char* answered_by_ = "model";
  size_t next_stream_ = 0;              // round robin over the streams in Next
  bool cancelled_ = false;
  std::function<void()> listener_;
};

// NormalizeRequest's context for this server's requests: the model's vocabulary and context, text
// encoded with `tokenizer` (BOS per `add_bos`), `default_max_tokens` (--max-tokens), and at most
// `max_prompt_bytes` of text.
RequestContext ServeRequestContext(const Tokenizer& tokenizer, int32_t vocab, int32_t max_model_len, bool add_bos,
                                   int32_t default_max_tokens, size_t max_prompt_bytes = SIZE_MAX);

// The longest text prompt that could fit the context: a token decodes to at most the vocabulary's
// longest piece, so more bytes than twice max_model_len of those (slack for normalization) cannot,
// and such a prompt is refused before it is tokenized.
size_t MaxPromptBytes(const Tokenizer& tokenizer, int32_t max_model_len);

// An admitted request: its id (for Cancel) and its deltas.
struct Admitted {
  RequestId id;
  std::shared_ptr<RequestStream> stream;
  int32_t prompt_tokens;
};

// What a reload asks for (POST /admin/reload, gRPC Admin.Reload, SIGHUP): the model's path and,
// where given, its tokenizer, chat template, draft model and version (empty: as at startup, or the
// new weights' hash for the version).
struct ReloadSpec {
  std::string model, tokenizer, chat_template, draft_model, model_version;
};

struct ReloadResult {
  std::string source, version, previous_version;
  double load_seconds = 0;  // loading the new bundle, the old one serving meanwhile
  int64_t previous_in_flight = 0;  // requests that finish on the previous model
};

class Server {
 public:
  // Loads the bundle a reload asks for, beside the one serving; errors name the field.
  using Loader = std::function<absl::StatusOr<ModelBundle>(const ReloadSpec&)>;

  // Serves `bundle`; the engine's thread starts here. Without a loader, Reload is refused.
  Server(ModelBundle bundle, ServeOptions options, Loader loader = nullptr);
  // A bundle of these (which must outlive the server), BOS added, no version.
  Server(Engine* engine, const Tokenizer* tokenizer, const ModelConfig& model, ServeOptions options);
  ~Server();

  // Validates, admits and queues a request on the current model. Errors: INVALID_ARGUMENT naming
  // the field and value, RESOURCE_EXHAUSTED when admission refuses, UNAVAILABLE while draining.
  // Refusals are counted.
  absl::StatusOr<Admitted> Submit(const ServeRequest& r);
  // The same for a request of r.n samples (one admission for all of them), on `bundle` (the one a
  // front end parsed the request with; null: the current one).
  absl::StatusOr<std::shared_ptr<Generation>> Generate(const ServeRequest& r,
                                                       std::shared_ptr<const ModelBundle> bundle = nullptr);
  // Aborts an admitted request; its KV blocks are free after the next step.
  void Cancel(RequestId id);
  void CancelAll() { loop_->CancelAll(); }
  // Empties the local prefix cache between two steps (EngineLoop::ResetPrefixCache), waiting at most
  // kResetTimeout; returns the blocks forgotten. Requests running keep their blocks; the shared
  // store (--kv-store) keeps its own.
  static constexpr std::chrono::milliseconds kResetTimeout{10000};
  absl::StatusOr<int32_t> ResetPrefixCache() { return loop_->ResetPrefixCache(kResetTimeout); }

  // The model requests are admitted to now.
  std::shared_ptr<const ModelBundle> Current() const;
  // Loads spec's model beside the current one, then makes it current between two steps: requests
  // admitted before finish on the model they started on, whose bundle is freed when the last one
  // ends. Reloads run one at a time (a second waits for the first). On any error the current model
  // keeps serving: FAILED_PRECONDITION where the server's state refuses (no loader, draining, or the
  // loader's own), else INVALID_ARGUMENT naming the field (the loader's errors, a chat template the
  // new vocabulary cannot serve).
  absl::StatusOr<ReloadResult> Reload(const ReloadSpec& spec);
  // Calls `f` after each reload (under the reload's lock), until RemoveReloadListener(id).
  int AddReloadListener(std::function<void(const ModelBundle&)> f);
  void RemoveReloadListener(int id);

  // Drain: from now on Submit answers UNAVAILABLE. WaitIdle returns true once no admitted request
  // is unfinished, false if `timeout` passed first.
  void StartDrain() { draining_ = true; }
  bool draining() const { return draining_; }
  bool WaitIdle(std::chrono::milliseconds timeout);
  int64_t in_flight() const { return in_flight_; }

  std::string MetricsText() const {
    return metrics_.RenderFrom([this] { return loop_->Snapshot(); });
  }
  EngineSnapshot Snapshot() const { return loop_->Snapshot(); }
  // A front end sent an FAQ answer (Generation::answered_by "faq"), `seconds` after the request
  // reached it.
  void ObserveFaqAnswer(double seconds) { metrics_.OnFaqAnswered(seconds); }
  const ServeOptions& options() const { return options_; }
  // num_spec_tokens of the responses' speculative-decoding metrics on `bundle`: the engine's k (the
  // largest under auto; 0 without a proposer, where a constrained request's grammar may still force
  // drafts), or -1 when responses carry none (ServeOptions::spec_metrics off). ShowsSpecDecoding
  // decides per request.
  int32_t spec_metrics_tokens(const ModelBundle& bundle) const {
    return options_.spec_metrics ? std::max(bundle.scheduler.num_spec_tokens, 0) : -1;
  }

 private:
  friend class Generation;
  // The bundle with what the server derives from it (ModelBundle::context, scheduler).
  std::shared_ptr<const ModelBundle> Bind(ModelBundle b) const;
  absl::StatusOr<ReloadResult> ReloadLocked(const ReloadSpec& spec);  // reload_mu_ held
  // Normalization and admission: the engine request of sample 0, or the refusal (counted).
  absl::StatusOr<Request> Admit(const ServeRequest& r, const ModelBundle& b);
  // The draining check, then NormalizeRequest and the constraint's compile (refusals counted).
  absl::StatusOr<Request> Normalize(const ServeRequest& r, const ModelBundle& b);
  // Admission control's decision on a normalized request: empty to admit, else its reason and, in
  // `detail`, the numbers behind it. Counts nothing.
  std::string AdmissionRefusal(int32_t priority, const ModelBundle& b, std::string* detail);
  // The refusal alone, counted under `reason`: RESOURCE_EXHAUSTED with the numbers behind it.
  absl::Status Refuse(const std::string& reason, const std::string& detail);
  // What an admission refusal turns into under --degrade: an FAQ answer, or the refusal (counted).
  absl::StatusOr<std::shared_ptr<Generation>> Degrade(const ServeRequest& r, const Request& first,
                                                      const std::shared_ptr<const ModelBundle>& b,
                                                      const std::string& reason, const std::string& detail);
  std::shared_ptr<RequestStream> Enqueue(const std::shared_ptr<const ModelBundle>& b, Request r);
  double NowS() const;
  void OnFinished(const RequestOutput& out);
  void Done();  // an admitted request is no longer in flight

  const ServeOptions options_;
  const Loader loader_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  mutable std::mutex current_mu_;
  std::shared_ptr<const ModelBundle> current_;  // guarded by current_mu_
  std::mutex reload_mu_;                        // one reload at a time; held while it runs
  std::vector<std::pair<int, std::function<void(const ModelBundle&)>>> reload_listeners_;  // guarded by reload_mu_
  int next_listener_ = 0;                                                                  // guarded by reload_mu_
  ServingMetrics metrics_;
  Admission admission_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> next_id_{1};
  std::atomic<int64_t> in_flight_{0};  // admitted, not finished
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
  std::unique_ptr<EngineLoop> loop_;  // last: its thread calls back into the members above
};

}  // namespace specula

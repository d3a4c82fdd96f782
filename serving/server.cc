#include "serving/server.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace specula {
namespace {

// A sample's whole answer made without the engine, as its one last delta: the text up to the
// request's first stop string (finish: stop string; else the end of the answer, finish: stop
// token), encoded without BOS, cut at max_tokens (finish: length).
RequestDelta AnswerDelta(const Request& r, RequestId id, const std::string& answer, const Tokenizer& tokenizer) {
  RequestDelta d;
  d.id = id;
  d.finished = true;
  RequestOutput& out = d.final;
  out.id = id;
  out.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  out.finish = FinishReason::kStopToken;
  size_t cut = answer.size();
  for (const std::string& stop : r.stop_strings) {
    if (!stop.empty()) cut = std::min(cut, answer.find(stop));
  }
  if (cut < answer.size()) out.finish = FinishReason::kStopString;
  out.text = answer.substr(0, cut);
  out.tokens = tokenizer.Encode(out.text, /*add_bos=*/false);
  if (static_cast<int32_t>(out.tokens.size()) > r.max_tokens) {
    out.tokens.resize(static_cast<size_t>(std::max(r.max_tokens, 0)));
    out.text = tokenizer.Decode(out.tokens);
    out.finish = FinishReason::kMaxTokens;
  }
  d.tokens = out.tokens;
  d.text = out.text;
  return d;
}

}  // namespace

Server::Server(ModelBundle bundle, ServeOptions options, Loader loader)
    : options_(std::move(options)),
      loader_(std::move(loader)),
      current_(Bind(std::move(bundle))),
      metrics_(options_.model_name, {"queue_len", "queue_delay", "ttft_slo", "draining", "invalid_argument"},
               {.max_model_len = current_->scheduler.max_model_len,
                .replica_id = options_.replica_id,
                .model_version = current_->version,
                .degrade_paths = options_.faq != nullptr ? std::vector<std::string>{"refuse", "faq"}
                                                         : std::vector<std::string>{"refuse"}}),
      admission_(options_.admission) {
  LoopHooks hooks;
  hooks.on_first_token = [this](double ttft_ms) { admission_.ObserveTtft(NowS(), ttft_ms); };
  hooks.on_finished = [this](const RequestOutput& out) { OnFinished(out); };
  hooks.on_refused = [this](RequestId) { Done(); };
  loop_ = std::make_unique<EngineLoop>(std::shared_ptr<Engine>(current_, current_->engine), std::move(hooks));
}

namespace {
ModelBundle Unowned(Engine* engine, const Tokenizer* tokenizer, const ModelConfig& model) {
  ModelBundle b;
  b.engine = engine;
  b.tokenizer = tokenizer;
  b.model = &model;
  return b;
}
}  // namespace

Server::Server(Engine* engine, const Tokenizer* tokenizer, const ModelConfig& model, ServeOptions options)
    : Server(Unowned(engine, tokenizer, model), std::move(options)) {}

// Aborts what still runs, before the members it calls go. The loop's thread may call Cancel while it
// ends (a generation dropped during its last deltas): loop_ stays set until that thread is gone.
Server::~Server() {
  loop_->Stop();
  loop_.reset();
}

std::shared_ptr<const ModelBundle> Server::Bind(ModelBundle b) const {
  b.scheduler = b.engine->scheduler().config();
  b.context = ServeRequestContext(*b.tokenizer, b.model->vocab_size, b.scheduler.max_model_len, b.add_bos,
                                  options_.default_max_tokens, MaxPromptBytes(*b.tokenizer, b.scheduler.max_model_len));
  return std::make_shared<const ModelBundle>(std::move(b));
}

std::shared_ptr<const ModelBundle> Server::Current() const {
  std::lock_guard<std::mutex> lock(current_mu_);
  return current_;
}

absl::StatusOr<ReloadResult> Server::Reload(const ReloadSpec& spec) {
  if (loader_ == nullptr) return absl::FailedPreconditionError("reload: this server has no model loader");
  std::lock_guard<std::mutex> serial(reload_mu_);
  absl::StatusOr<ReloadResult> r = ReloadLocked(spec);
  if (r.ok()) {
    std::fprintf(stderr, "[specula] reloaded %s: version %s (was %s), loaded in %.2f s; %lld requests finish on %s\n",
                 r->source.c_str(), r->version.c_str(), r->previous_version.c_str(), r->load_seconds,
                 static_cast<long long>(r->previous_in_flight), r->previous_version.c_str());
  } else {
    std::fprintf(stderr, "[specula] reload of %s refused (the current model keeps serving): %s\n", spec.model.c_str(),
                 std::string(r.status().message()).c_str());
  }
  return r;
}

absl::StatusOr<ReloadResult> Server::ReloadLocked(const ReloadSpec& spec) {
  if (draining_) return absl::FailedPreconditionError("reload: the server is draining");
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ModelBundle> loaded = loader_(spec);
  if (!loaded.ok()) {
    // The request's files are at fault unless the server's own state refuses (tensor parallelism, CUDA).
    const absl::Status& st = loaded.status();
    if (st.code() == absl::StatusCode::kFailedPrecondition) return st;
    return absl::InvalidArgumentError(st.message());
  }
  std::shared_ptr<const ModelBundle> next = Bind(*std::move(loaded));
  RETURN_IF_ERROR(CheckChatVocabulary(*next, spec.chat_template.empty() ? "model" : "chat_template"));
  ReloadResult result;
  result.source = next->source;
  result.version = next->version;
  result.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::shared_ptr<const ModelBundle> previous;
  {
    std::lock_guard<std::mutex> lock(current_mu_);
    previous = std::exchange(current_, next);
  }
  result.previous_version = previous->version;
  result.previous_in_flight = in_flight_;
  metrics_.SetModelVersion(next->version);
  if (absl::Status st = loop_->Switch(std::shared_ptr<Engine>(next, next->engine), kResetTimeout); !st.ok()) {
    // Requests admitted from now on already run on the new model; the loop adopts it after its step.
    std::fprintf(stderr, "[specula] reload: %s\n", std::string(st.message()).c_str());
  }
  for (const auto& [id, f] : reload_listeners_) f(*next);
  return result;
}

int Server::AddReloadListener(std::function<void(const ModelBundle&)> f) {
  std::lock_guard<std::mutex> serial(reload_mu_);
  reload_listeners_.emplace_back(next_listener_, std::move(f));
  return next_listener_++;
}

void Server::RemoveReloadListener(int id) {
  std::lock_guard<std::mutex> serial(reload_mu_);
  std::erase_if(reload_listeners_, [id](const auto& l) { return l.first == id; });
}

double Server::NowS() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Server::OnFinished(const RequestOutput& out) {
  metrics_.OnFinished(out);
  admission_.ObserveCompletion(NowS());
  Done();
}

void Server::Done() {
  // Notified under the lock (see EngineLoop::Submit): the last Done may run on a gRPC thread while
  // the main thread, woken by it, goes on to destroy the server.
  std::lock_guard<std::mutex> lock(idle_mu_);
  --in_flight_;
  idle_cv_.notify_all();
}

bool Server::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(idle_mu_);
  return idle_cv_.wait_for(lock, timeout, [&] { return in_flight_ == 0; });
}

size_t MaxPromptBytes(const Tokenizer& tokenizer, int32_t max_model_len) {
  size_t longest = 1;
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) longest = std::max(longest, tokenizer.DecodeToken(-1, id).size());
  return 2 * longest * static_cast<size_t>(std::max(max_model_len, 1));
}

PromptInput ServePrompt(const ServeRequest& r) {
  PromptInput p;
  if (!r.prompt.empty()) p.text = r.prompt;  // gRPC's proto3 strings cannot tell empty from unset
  p.templated = r.templated;
  p.ids = r.prompt_token_ids;
  return p;
}

RequestContext ServeRequestContext(const Tokenizer& tokenizer, int32_t vocab, int32_t max_model_len, bool add_bos,
                                   int32_t default_max_tokens, size_t max_prompt_bytes) {
  RequestContext c = ModelRequestContext(&tokenizer, vocab, max_model_len);
  c.add_bos = add_bos;
  c.default_max_tokens = default_max_tokens;
  c.max_prompt_bytes = max_prompt_bytes;
  return c;
}

absl::StatusOr<Request> Server::Normalize(const ServeRequest& r, const ModelBundle& b) {
  if (draining_) {
    metrics_.OnRejected("draining");
    return absl::UnavailableError("the server is draining (shutting down); retry on another replica");
  }
  RequestSpec spec = r;  // the spec alone: the prompt's text is not copied
  absl::StatusOr<std::vector<TokenId>> prompt = NormalizeRequest(r.surface, b.context, ServePrompt(r), &spec);
  if (!prompt.ok()) {
    metrics_.OnRejected("invalid_argument");
    return prompt.status();
  }
  std::shared_ptr<const CompiledConstraint> compiled;  // on this thread: compiling never holds up a step
  if (spec.constraint.active()) {
    absl::StatusOr<std::shared_ptr<const CompiledConstraint>> c = b.engine->CompileConstraint(spec);
    if (!c.ok()) {
      metrics_.OnRejected("invalid_argument");
      return c.status();
    }
    compiled = *std::move(c);
  }
  Request req = MakeRequest(next_id_++, *std::move(prompt), std::move(spec));
  req.compiled_constraint = std::move(compiled);
  ResolveSeed(&req, static_cast<uint64_t>(req.id));  // unset: the id, as the table's serving rows say
  req.n = 1;  // each sample is an engine request of its own (Generate makes r.n of them)
  return req;
}

std::string Server::AdmissionRefusal(int32_t priority, const ModelBundle& b, std::string* detail) {
  // Lock-free reads of the last step's state: admission never waits for the engine's thread.
  const int32_t running = loop_->num_running();
  QueueState q;
  q.queued = static_cast<int32_t>(std::max<int64_t>(0, in_flight_ - running));
  q.free_slots = std::max(0, b.scheduler.max_num_seqs - running);
  q.oldest_queued_ms = loop_->oldest_queued_ms();
  return admission_.Check(priority, q, NowS(), detail);
}

absl::StatusOr<Request> Server::Admit(const ServeRequest& r, const ModelBundle& b) {
  ASSIGN_OR_RETURN(Request req, Normalize(r, b));
  std::string detail;
  if (std::string reason = AdmissionRefusal(r.priority, b, &detail); !reason.empty()) return Refuse(reason, detail);
  return req;
}

absl::Status Server::Refuse(const std::string& reason, const std::string& detail) {
  metrics_.OnRejected(reason);
  metrics_.OnDegraded(reason, "refuse");
  return absl::ResourceExhaustedError(absl::StrCat("overloaded: ", detail));
}

std::shared_ptr<RequestStream> Server::Enqueue(const std::shared_ptr<const ModelBundle>& b, Request r) {
  ++in_flight_;  // before Submit: the loop may finish it before we return
  return loop_->Submit(std::move(r), std::shared_ptr<Engine>(b, b->engine));
}

absl::StatusOr<Admitted> Server::Submit(const ServeRequest& r) {
  if (r.n != 1) {
    return absl::InvalidArgumentError(absl::StrCat(RulesOf(r.surface).field_prefix, "n: ", r.n, " samples need Generate"));
  }
  const std::shared_ptr<const ModelBundle> b = Current();
  ASSIGN_OR_RETURN(Request req, Admit(r, *b));
  Admitted a{req.id, nullptr, static_cast<int32_t>(req.prompt.size())};
  a.stream = Enqueue(b, std::move(req));
  return a;
}

absl::StatusOr<std::shared_ptr<Generation>> Server::Generate(const ServeRequest& r,
                                                              std::shared_ptr<const ModelBundle> b) {
  if (b == nullptr) b = Current();
  ASSIGN_OR_RETURN(Request first, Normalize(r, *b));  // validates n among the rest
  std::string detail;
  if (std::string reason = AdmissionRefusal(r.priority, *b, &detail); !reason.empty()) {
    return Degrade(r, first, b, reason, detail);
  }
  // Sample i draws from seed + i: distinct samples, reproducible with a seed.
  std::vector<Request> samples(r.n, first);
  for (int32_t i = 1; i < r.n; ++i) {
    samples[i].id = next_id_++;
    samples[i].sampling.seed = first.sampling.seed + static_cast<uint64_t>(i);
  }
  std::shared_ptr<Generation> g(new Generation(this, std::move(b), std::move(samples)));
  std::vector<std::shared_ptr<RequestStream>> fresh;
  {
    std::lock_guard<std::mutex> lock(g->mu_);
    fresh = g->SubmitUpTo(1);
  }
  g->Listen(fresh);
  return g;
}

absl::StatusOr<std::shared_ptr<Generation>> Server::Degrade(const ServeRequest& r, const Request& first,
                                                            const std::shared_ptr<const ModelBundle>& b,
                                                            const std::string& reason, const std::string& detail) {
  // An FAQ answer has no logprobs and follows no grammar: such requests are refused as before.
  const bool plain = first.logprobs < 0 && first.prompt_logprobs < 0 && !first.constraint.active();
  const std::string* answer = options_.faq != nullptr && plain ? options_.faq->Find(r.faq_query) : nullptr;
  if (answer == nullptr) return Refuse(reason, detail);
  metrics_.OnDegraded(reason, "faq");
  std::vector<RequestDelta> answers(r.n, AnswerDelta(first, first.id, *answer, *b->tokenizer));  // encoded once
  for (int32_t i = 1; i < r.n; ++i) answers[i].id = answers[i].final.id = next_id_++;
  return std::shared_ptr<Generation>(new Generation(this, b, first.prompt, std::move(answers), "faq"));
}

Generation::Generation(Server* server, std::shared_ptr<const ModelBundle> bundle, std::vector<Request> requests)
    : server_(server), bundle_(std::move(bundle)), prompt_(requests[0].prompt), requests_(std::move(requests)) {
  for (const Request& r : requests_) ids_.push_back(r.id);
}

Generation::Generation(Server* server, std::shared_ptr<const ModelBundle> bundle, std::vector<TokenId> prompt,
                       std::vector<RequestDelta> answers, const char* answered_by)
    : server_(server), bundle_(std::move(bundle)), prompt_(std::move(prompt)), ready_(std::move(answers)),
      answered_by_(answered_by) {
  for (const RequestDelta& d : ready_) ids_.push_back(d.id);
}

Generation::~Generation() { Cancel(); }

int32_t Generation::spec_metrics_tokens() const { return server_->spec_metrics_tokens(*bundle_); }

bool Generation::kv_store_metrics() const { return server_->options().kv_store; }

// On the loop's thread (or Generate's, for a delta already waiting), never inside a reader's Next:
// a reader may call Next from its listener while holding its own lock, so Next must not start
// listeners. Sample 0's first delta submits the other samples here: its prompt's full blocks are
// cached by then, and they run whether or not anyone reads yet.
void Generation::Notify() {
  std::function<void()> listener;
  std::vector<std::shared_ptr<RequestStream>> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (streams_.size() == 1 && n() > 1 && !cancelled_) fresh = SubmitUpTo(requests_.size());
    listener = listener_;
    cv_.notify_all();
  }
  Listen(fresh);
  if (listener) listener();
}

std::vector<std::shared_ptr<RequestStream>> Generation::SubmitUpTo(size_t n) {
  std::vector<std::shared_ptr<RequestStream>> fresh;
  for (size_t i = streams_.size(); i < n; ++i) {
    streams_.push_back(server_->Enqueue(bundle_, std::move(requests_[i])));
    fresh.push_back(streams_.back());
  }
  return fresh;
}

void Generation::Listen(const std::vector<std::shared_ptr<RequestStream>>& streams) {
  // A delta may arrive after the generation is gone (its reader dropped it): the listener holds
  // only a weak reference.
  for (const auto& s : streams) {
    s->SetListener([self = weak_from_this()] {
      if (auto g = self.lock()) g->Notify();
    });
  }
}

std::optional<Generation::Event> Generation::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (!ready_.empty()) {
      Event e{static_cast<int32_t>(n() - ready_.size()), std::move(ready_.front())};
      ready_.erase(ready_.begin());
      return e;
    }
    for (size_t k = 0; k < streams_.size(); ++k) {
      const size_t i = (next_stream_ + k) % streams_.size();
      if (auto d = streams_[i]->Next(std::chrono::milliseconds(0))) {
        next_stream_ = i + 1;
        return Event{static_cast<int32_t>(i), *std::move(d)};
      }
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
  }
}

void Generation::SetListener(std::function<void()> listener) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = listener;
  }
  if (listener) listener();  // events may be waiting; Next says
}

void Generation::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return;
  cancelled_ = true;
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (!streams_[i]->done()) server_->Cancel(ids_[i]);  // a finished sample needs no server
  }
  for (size_t i = streams_.size(); i < requests_.size(); ++i) {  // never submitted: end them here
    RequestDelta d;
    d.id = ids_[i];
    d.finished = true;
    d.final.id = ids_[i];
    d.final.finish = FinishReason::kAborted;
    d.final.prompt_tokens = static_cast<int32_t>(prompt_.size());
    ready_.push_back(std::move(d));
  }
  cv_.notify_all();
}

void Server::Cancel(RequestId id) { loop_->Cancel(id); }

}  // namespace specula

#include "serving/server.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace specula {

Server::Server(Engine* engine, const Tokenizer* tokenizer, const ModelConfig& model, ServeOptions options)
    : tokenizer_(tokenizer),
      model_(model),
      scheduler_(engine->scheduler().config()),
      options_(std::move(options)),
      metrics_(options_.model_name, {"queue_len", "queue_delay", "ttft_slo", "draining", "invalid_argument"},
               scheduler_.max_model_len),
      admission_(options_.admission) {
  LoopHooks hooks;
  hooks.on_first_token = [this](double ttft_ms) { admission_.ObserveTtft(NowS(), ttft_ms); };
  hooks.on_finished = [this](const RequestOutput& out) { OnFinished(out); };
  hooks.on_refused = [this](RequestId) { Done(); };
  loop_ = std::make_unique<EngineLoop>(engine, std::move(hooks));
}

Server::~Server() { loop_.reset(); }  // aborts what still runs, before the members it calls go

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

absl::Status ValidateServeRequest(const ServeRequest& r, const Tokenizer& tokenizer, int32_t vocab,
                                  int32_t max_model_len, bool add_bos, std::vector<TokenId>* prompt) {
  const std::string& pre = r.field_prefix;
  if (r.prompt.empty() == r.prompt_token_ids.empty()) {
    return absl::InvalidArgumentError(r.prompt.empty() ? "prompt: empty; give prompt or prompt_token_ids"
                                                       : "prompt and prompt_token_ids: give one, not both");
  }
  if (!r.prompt_token_ids.empty()) {
    for (size_t i = 0; i < r.prompt_token_ids.size(); ++i) {
      const TokenId t = r.prompt_token_ids[i];
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt_token_ids[", i, "]: ", t, " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
    *prompt = r.prompt_token_ids;
  } else {
    *prompt = tokenizer.Encode(r.prompt, add_bos && !r.templated);
    if (prompt->empty()) return absl::InvalidArgumentError("prompt: encodes to no tokens");
  }
  const int32_t len = static_cast<int32_t>(prompt->size());
  if (len >= max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(r.prompt_token_ids.empty() ? "prompt" : "prompt_token_ids", ": ",
                                                   len, " tokens leave no room in the context of ",
                                                   max_model_len, " tokens"));
  }
  if (r.max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(pre, "max_tokens: must be >= 0, got ", r.max_tokens));
  }
  if (r.max_tokens > max_model_len - len) {  // as vLLM: a 400, not a silent cut
    return absl::InvalidArgumentError(absl::StrCat(pre, "max_tokens: ", r.max_tokens, " and the prompt's ", len,
                                                   " tokens exceed the context of ", max_model_len,
                                                   " tokens; at most ", max_model_len - len, " here"));
  }
  for (size_t i = 0; i < r.stop.size(); ++i) {
    if (r.stop[i].empty()) return absl::InvalidArgumentError(absl::StrCat(pre, "stop[", i, "]: empty string"));
  }
  if (auto st = ValidateSamplingParams(r.sampling); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(pre, st.message()));  // the message starts with the field
  }
  return absl::OkStatus();
}

absl::Status Server::Validate(const ServeRequest& r, std::vector<TokenId>* prompt) const {
  return ValidateServeRequest(r, *tokenizer_, model_.vocab_size, scheduler_.max_model_len, options_.add_bos, prompt);
}

absl::StatusOr<Admitted> Server::Submit(const ServeRequest& r) {
  if (draining_) {
    metrics_.OnRejected("draining");
    return absl::UnavailableError("the server is draining (shutting down); retry on another replica");
  }
  std::vector<TokenId> prompt;
  if (absl::Status st = Validate(r, &prompt); !st.ok()) {
    metrics_.OnRejected("invalid_argument");
    return st;
  }
  // Lock-free reads of the last step's state: admission never waits for the engine's thread.
  const int32_t running = loop_->num_running();
  QueueState q;
  q.queued = static_cast<int32_t>(std::max<int64_t>(0, in_flight_ - running));
  q.free_slots = std::max(0, scheduler_.max_num_seqs - running);
  q.oldest_queued_ms = loop_->oldest_queued_ms();
  std::string detail;
  if (std::string reason = admission_.Check(r.priority, q, NowS(), &detail); !reason.empty()) {
    metrics_.OnRejected(reason);
    return absl::ResourceExhaustedError(absl::StrCat("overloaded: ", detail));
  }
  Request req;
  req.id = next_id_++;
  req.prompt = std::move(prompt);
  const int32_t room = scheduler_.max_model_len - static_cast<int32_t>(req.prompt.size());
  req.max_tokens = std::min(r.max_tokens > 0 ? r.max_tokens : options_.default_max_tokens, room);
  req.sampling = r.sampling;
  req.sampling.seed = r.seed.has_value() ? *r.seed : static_cast<uint64_t>(req.id);
  req.stop_strings = r.stop;
  req.ignore_eos = r.ignore_eos;
  req.priority = r.priority;
  Admitted a{req.id, nullptr, static_cast<int32_t>(req.prompt.size())};
  ++in_flight_;  // before Submit: the loop may finish it before we return
  a.stream = loop_->Submit(std::move(req));
  return a;
}

void Server::Cancel(RequestId id) { loop_->Cancel(id); }

}  // namespace specula

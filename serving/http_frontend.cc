#include "serving/http_frontend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "serving/http_server.h"
#include "serving/openai_api.h"

namespace specula {
namespace {

using json = nlohmann::json;

// OpenAI's error shape (openai_api.h).
void SendError(HttpExchange& ex, const absl::Status& st) {
  const int status = HttpStatusOf(st);
  ex.Respond(status, "application/json", ErrorJson(st, status));
}

// A generation's own headers: the path and the model version that answered it.
HttpHeaders Headers(const Generation& gen) {
  HttpHeaders h = {{kAnsweredByHeader, gen.answered_by()}};
  if (!gen.model_version().empty()) h.emplace_back(kModelVersionHeader, gen.model_version());
  return h;
}

// One call's answer. The generation's listener (on the engine loop's thread, after each delta)
// hands the drain to the HTTP handler pool, so that turning events into JSON and bytes overlaps the
// next step instead of delaying it; the drain queues the bytes to the connection, never waiting on
// the client.
struct Reply {
  Server* server;
  std::chrono::steady_clock::time_point start;  // the handler's start, for the FAQ answers' histogram
  std::shared_ptr<HttpExchange> ex;
  std::unique_ptr<OpenAiResponder> responder;
  bool stream = false;
  std::atomic<bool> drain_due{false};  // a drain is queued: later deltas ride on it
  std::mutex mu;                    // one drain at a time, so events leave in order
  std::shared_ptr<Generation> gen;  // guarded by mu; dropped once answered (it holds the listener
                                    // that holds this, and dropping it cancels what still runs)

  void Drain() {
    std::shared_ptr<Generation> done;  // released after mu
    std::lock_guard<std::mutex> l(mu);
    while (gen != nullptr) {
      auto e = gen->Next(std::chrono::milliseconds(0));
      if (!e) break;
      auto bytes = responder->Add(e->index, e->delta);
      // Counted before its bytes go: a client that has the answer finds it in /metrics.
      if (bytes.ok() && responder->done() && std::string_view(gen->answered_by()) == "faq") {
        server->ObserveFaqAnswer(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      if (!bytes.ok()) {  // not streamed: a sample the engine refused
        SendError(*ex, bytes.status());
      } else if (stream) {
        if (!bytes->empty()) ex->Write(*std::move(bytes));  // false once the client left: OnClose cancelled
        if (responder->done()) ex->End();
      } else if (responder->done()) {
        ex->Respond(200, "application/json", *std::move(bytes), Headers(*gen));
      }
      if (!bytes.ok() || responder->done()) {
        gen->SetListener(nullptr);
        done = std::move(gen);
      }
    }
  }
};

}  // namespace

struct HttpFrontend::Impl {
  Server* server;
  std::unique_ptr<HttpServer> http;
  bool api_key = false;  // --api-key is set: the admin routes are open to its holders
  int reload_listener = -1;

  void Handle(HttpRequest req, const std::shared_ptr<HttpExchange>& ex, bool chat);
  void Reload(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const;
  std::vector<HttpRoute> Routes();
};

// On a worker thread: parses (a chat template render and the tokenization of a long prompt take
// their time here, not on the io thread), starts the generation, and leaves the answer to its
// listener.
void HttpFrontend::Impl::Handle(HttpRequest req, const std::shared_ptr<HttpExchange>& ex, bool chat) {
  const auto start = std::chrono::steady_clock::now();
  const std::string model = server->options().model_name;
  // The model this request is bound to: its template renders it, its tokenizer encodes it.
  std::shared_ptr<const ModelBundle> bundle = server->Current();
  auto parsed = ParseHttpRequestBody(req.body, chat, model,
                                     bundle->chat_template.has_value() ? &*bundle->chat_template : nullptr,
                                     bundle->chat_source);
  if (!parsed.ok()) return SendError(*ex, parsed.status());
  auto started = server->Generate(parsed->request, bundle);
  if (!started.ok()) return SendError(*ex, started.status());
  std::shared_ptr<Generation> gen = *std::move(started);
  auto reply = std::make_shared<Reply>();
  reply->server = server;
  reply->start = start;
  reply->ex = ex;
  reply->stream = parsed->stream;
  reply->responder = std::make_unique<OpenAiResponder>(
      *parsed, model, absl::StrCat(chat ? "chatcmpl-" : "cmpl-", gen->id()), *gen, gen->bundle().tokenizer);
  reply->gen = gen;
  // A client that goes away cancels its samples, which frees their KV blocks.
  ex->OnClose([weak = std::weak_ptr<Generation>(gen)] {
    if (auto g = weak.lock()) g->Cancel();
  });
  if (parsed->stream) ex->StartStream(200, "text/event-stream", Headers(*gen));
  gen->SetListener([reply] {
    if (reply->drain_due.exchange(true)) return;
    reply->ex->Defer([reply] {
      reply->drain_due = false;  // before draining: a delta that comes during the drain queues another
      reply->Drain();
    });
  });
}

// POST /admin/reload {"model": PATH, "tokenizer", "chat_template", "draft_model", "model_version"}:
// on a handler thread, which waits while the new model loads (Server::Reload). The key checked by
// HttpServer is required: without one configured, the route is refused.
void HttpFrontend::Impl::Reload(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const {
  if (!api_key) {
    return SendError(*ex, absl::PermissionDeniedError("/admin/reload: admin routes need the server started with --api-key"));
  }
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return SendError(*ex, absl::InvalidArgumentError("body: not a JSON object"));
  ReloadSpec spec;
  const std::pair<const char*, std::string*> fields[] = {{"model", &spec.model}, {"tokenizer", &spec.tokenizer},
                                                         {"chat_template", &spec.chat_template},
                                                         {"draft_model", &spec.draft_model},
                                                         {"model_version", &spec.model_version}};
  for (const auto& item : body.items()) {
    const std::string& key = item.key();
    const json& value = item.value();
    const auto* f = std::find_if(std::begin(fields), std::end(fields), [&key](const auto& f) { return key == f.first; });
    if (f == std::end(fields)) {
      return SendError(*ex, absl::InvalidArgumentError(absl::StrCat(
                                key, ": unknown field (model, tokenizer, chat_template, draft_model, model_version)")));
    }
    if (!value.is_string() || value.get<std::string>().empty()) {
      return SendError(*ex, absl::InvalidArgumentError(absl::StrCat(key, ": must be a non-empty string")));
    }
    *f->second = value.get<std::string>();
  }
  if (spec.model.empty()) return SendError(*ex, absl::InvalidArgumentError("model: required (the new model's path)"));
  absl::StatusOr<ReloadResult> r = server->Reload(spec);
  if (!r.ok()) return SendError(*ex, r.status());
  ex->Respond(200, "application/json",
              json{{"reloaded", true}, {"model", r->source}, {"model_version", r->version},
                   {"previous_model_version", r->previous_version}, {"load_seconds", r->load_seconds},
                   {"previous_in_flight", r->previous_in_flight}}.dump());
}

std::vector<HttpRoute> HttpFrontend::Impl::Routes() {
  auto handle = [this](bool chat) {
    return [this, chat](HttpRequest q, std::shared_ptr<HttpExchange> ex) { Handle(std::move(q), ex, chat); };
  };
  auto models = [this](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    const std::shared_ptr<const ModelBundle> b = server->Current();
    json m = {{"id", server->options().model_name}, {"object", "model"}, {"created", std::time(nullptr)},
              {"owned_by", "specula"}, {"max_model_len", b->scheduler.max_model_len}};
    if (!b->version.empty()) m["version"] = b->version;
    ex->Respond(200, "application/json", json{{"object", "list"}, {"data", {m}}}.dump());
  };
  auto health = [this](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    if (server->draining()) return SendError(*ex, absl::UnavailableError("draining"));
    ex->Respond(200, "", "");
  };
  // Liveness: 200 while the process serves, draining included (/health is readiness).
  auto live = [](HttpRequest, std::shared_ptr<HttpExchange> ex) { ex->Respond(200, "", ""); };
  auto metrics = [this](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    ex->Respond(200, "text/plain; version=0.0.4; charset=utf-8", server->MetricsText());
  };
  // vLLM's route: the API key guards it as it does /v1/*. On a handler thread, which waits for the
  // step in progress to end (bounded by Server::kResetTimeout).
  auto reset = [this](HttpRequest, std::shared_ptr<HttpExchange> ex) {
    absl::StatusOr<int32_t> blocks = server->ResetPrefixCache();
    if (!blocks.ok()) return SendError(*ex, absl::UnavailableError(blocks.status().message()));
    ex->Respond(200, "application/json", json{{"reset", true}, {"blocks", *blocks}}.dump());
  };
  return {{"POST", "/v1/completions", handle(false)}, {"POST", "/v1/chat/completions", handle(true)},
          {"GET", "/v1/models", models}, {"GET", "/health", health}, {"GET", "/live", live}, {"GET", "/metrics", metrics},
          {"POST", "/reset_prefix_cache", reset},
          {"POST", "/admin/reload", [this](HttpRequest q, std::shared_ptr<HttpExchange> ex) { Reload(q, ex); }}};
}

HttpFrontend::HttpFrontend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpFrontend::~HttpFrontend() {
  Stop();
  if (impl_->reload_listener >= 0) impl_->server->RemoveReloadListener(impl_->reload_listener);
}

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(Server* server, const HttpOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->server = server;
  impl->api_key = !options.security.api_key.empty();
  HttpServerOptions o;
  o.host = options.host;
  o.port = options.port;
  o.max_body_bytes = options.max_request_bytes;
  o.max_body_name = "--max-request-bytes";
  o.worker_threads = options.threads;
  o.io_threads = 1;  // parsing and writing bytes: one core's fraction even under a flood
  o.security = options.security;
  // Every response names the replica and the current model version, refusals and probes included:
  // a router's retries and a benchmark see which replica answered. A generation names its own
  // version (Headers), which a reload may have made the previous one.
  if (const std::string& id = server->options().replica_id; !id.empty()) o.response_headers = {{kReplicaHeader, id}};
  if (const std::string v = server->Current()->version; !v.empty()) o.response_headers.emplace_back(kModelVersionHeader, v);
  auto http = HttpServer::Start(std::move(o), impl->Routes());
  if (!http.ok()) {
    return absl::Status(http.status().code(), absl::StrCat("--http-port: ", http.status().message()));
  }
  impl->http = *std::move(http);
  impl->reload_listener = server->AddReloadListener([http = impl->http.get()](const ModelBundle& b) {
    if (!b.version.empty()) http->SetResponseHeader(kModelVersionHeader, b.version);
  });
  return std::unique_ptr<HttpFrontend>(new HttpFrontend(std::move(impl)));
}

int HttpFrontend::port() const { return impl_->http->port(); }

void HttpFrontend::Stop() {
  if (impl_->http) impl_->http->Stop();
}

}  // namespace specula

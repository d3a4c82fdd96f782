#include "serving/http_frontend.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::json;

int HttpCode(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

// OpenAI's error shape. `param` is the field an invalid-argument message starts with.
void SendError(httplib::Response& res, const absl::Status& st) {
  const int code = HttpCode(st);
  const std::string msg(st.message());
  json param = nullptr;
  if (code == 400) param = msg.substr(0, msg.find_first_of(":[ "));
  const char* type = code == 400 ? "invalid_request_error"
                     : code == 404 ? "not_found_error"
                     : code == 429 ? "rate_limit_error"
                     : code == 503 ? "service_unavailable_error"
                                   : "internal_error";
  res.status = code;
  res.set_content(json{{"error", {{"message", msg}, {"type", type}, {"param", param}, {"code", code}}}}.dump(),
                  "application/json");
}

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Fields that would change the output and are not implemented yet: refused by name, never ignored.
// A value that changes nothing (0, an empty list or object, plain text, no tool) passes.
absl::Status RefuseUnimplemented(const json& j) {
  auto present = [&](const char* f) { return j.contains(f) && !j[f].is_null(); };
  for (const char* f : {"frequency_penalty", "presence_penalty"}) {
    if (present(f) && !(j[f].is_number() && j[f].get<double>() == 0.0)) {
      return Bad(f, "not supported yet (repetition_penalty is)");
    }
  }
  for (const char* f : {"logit_bias", "tools", "functions"}) {
    if (present(f) && !j[f].empty()) return Bad(f, "not supported yet");
  }
  for (const char* f : {"tool_choice", "function_call"}) {
    if (present(f) && j[f] != "none" && j[f] != "auto") return Bad(f, "not supported yet: no tools can be called");
  }
  if (present("response_format") && !(j["response_format"].is_object() && j["response_format"].value("type", json()) == "text")) {
    return Bad("response_format", "only {\"type\": \"text\"} is supported yet");
  }
  for (const char* f : {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"}) {
    if (present(f)) return Bad(f, "not supported yet");
  }
  return absl::OkStatus();
}

// The request fields both endpoints share (vLLM's extensions top_k, min_p, repetition_penalty,
// ignore_eos and priority included). OpenAI's defaults: temperature 1, max_tokens 16 for
// completions (the server's --max-tokens for chat).
absl::Status ParseCommon(const json& j, bool chat, ServeRequest* r, bool* stream, bool* usage_in_stream) {
  auto number = [&](const char* f, float* dst) -> absl::Status {
    if (!j.contains(f) || j[f].is_null()) return absl::OkStatus();
    if (!j[f].is_number()) return Bad(f, absl::StrCat("must be a number, got ", j[f].dump()));
    *dst = j[f].get<float>();
    return absl::OkStatus();
  };
  auto integer = [&](const char* f, int32_t* dst) -> absl::Status {
    if (!j.contains(f) || j[f].is_null()) return absl::OkStatus();
    if (!j[f].is_number_integer()) return Bad(f, absl::StrCat("must be an integer, got ", j[f].dump()));
    *dst = j[f].get<int32_t>();
    return absl::OkStatus();
  };
  r->sampling.temperature = 1.0f;
  r->max_tokens = chat ? 0 : 16;
  for (auto st : {number("temperature", &r->sampling.temperature), number("top_p", &r->sampling.top_p),
                  number("min_p", &r->sampling.min_p), number("repetition_penalty", &r->sampling.repetition_penalty),
                  integer("top_k", &r->sampling.top_k), integer("max_tokens", &r->max_tokens),
                  integer("max_completion_tokens", &r->max_tokens), integer("priority", &r->priority)}) {
    if (!st.ok()) return st;
  }
  if (r->sampling.top_k < 0) r->sampling.top_k = 0;  // vLLM: -1 is off
  if (j.contains("max_tokens") && r->max_tokens <= 0) return Bad("max_tokens", absl::StrCat("must be >= 1, got ", r->max_tokens));
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) return Bad("seed", absl::StrCat("must be an integer, got ", j["seed"].dump()));
    r->seed = static_cast<uint64_t>(j["seed"].get<int64_t>());
  }
  if (j.contains("n") && !j["n"].is_null() && j["n"] != 1) return Bad("n", "only 1 is supported");
  RETURN_IF_ERROR(RefuseUnimplemented(j));
  for (const char* f : {"logprobs", "top_logprobs", "echo", "suffix", "best_of"}) {
    if (j.contains(f) && !j[f].is_null() && j[f] != false && !(std::string(f) == "best_of" && j[f] == 1)) {
      return Bad(f, "not supported");
    }
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r->stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& e : s) {
        if (!e.is_string()) return Bad("stop", "must be a string or a list of strings");
        r->stop.push_back(e.get<std::string>());
      }
    } else {
      return Bad("stop", "must be a string or a list of strings");
    }
  }
  if (j.contains("ignore_eos")) r->ignore_eos = j["ignore_eos"].is_boolean() && j["ignore_eos"].get<bool>();
  *stream = j.contains("stream") && j["stream"].is_boolean() && j["stream"].get<bool>();
  *usage_in_stream = j.contains("stream_options") && j["stream_options"].is_object() &&
                     j["stream_options"].value("include_usage", json()) == true;
  return absl::OkStatus();
}

absl::Status ParsePrompt(const json& j, ServeRequest* r) {
  if (!j.contains("prompt")) return Bad("prompt", "missing");
  json p = j["prompt"];
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];  // a batch of one
  if (p.is_string()) {
    r->prompt = p.get<std::string>();
    if (r->prompt.empty()) return Bad("prompt", "empty");
    return absl::OkStatus();
  }
  if (p.is_array() && !p.empty()) {
    for (size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_number_integer()) return Bad(absl::StrCat("prompt[", i, "]"), "must be a token id");
      r->prompt_token_ids.push_back(p[i].get<int32_t>());
    }
    return absl::OkStatus();
  }
  return Bad("prompt", "must be a string, a list of token ids, or a list of one of either");
}

const char* FinishName(FinishReason f) {
  switch (f) {
    case FinishReason::kStopToken:
    case FinishReason::kStopString: return "stop";
    case FinishReason::kMaxTokens: return "length";
    default: return "abort";
  }
}

// The socket a request came on, to see its client go away while a non-streamed request runs.
// cpp-httplib 0.11 (Debian 12's) hands a handler neither the socket nor 0.12's
// req.is_connection_closed, so this finds the open socket whose local port and peer address and
// port are the request's (the connection's 4-tuple: unique among live sockets, and the handler's
// thread keeps this one open until the handler returns). -1 if none matches.
int ConnectionSocket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  auto host_port = [](const sockaddr_storage& a, socklen_t len, std::string* host) {
    char h[NI_MAXHOST], port[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      return -1;
    }
    *host = h;  // as httplib writes req.remote_addr
    return std::atoi(port);
  };
  int found = -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (fd == dirfd(dir) || getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
      continue;
    }
    std::string local_host, peer_host;
    if (host_port(local, local_len, &local_host) == req.local_port &&
        host_port(peer, peer_len, &peer_host) == req.remote_port && peer_host == req.remote_addr) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

// Whether the client closed the connection (or it broke): end of stream or an error on the socket.
// Bytes waiting to be read (a pipelined request) are not a close.
bool PeerClosed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

// OpenAI chat messages: content is a string or a list of {"type": "text", "text": ...} parts.
absl::StatusOr<std::vector<ChatMessage>> ParseMessages(const json& j) {
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
    return Bad("messages", "must be a non-empty list of {\"role\", \"content\"}");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j["messages"].size(); ++i) {
    const json& m = j["messages"][i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return Bad(field + ".role", "must be a string");
    ChatMessage msg{m["role"].get<std::string>(), ""};
    static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
    if (!kRoles.count(msg.role)) {
      return Bad(field + ".role", absl::StrCat("'", msg.role, "' is not one of system, developer, user, assistant, tool"));
    }
    const json c = m.value("content", json(nullptr));
    if (c.is_string()) {
      msg.content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string()) {
          return Bad(field + ".content", "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
        }
        msg.content += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      return Bad(field + ".content", "must be a string or a list of text parts");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

struct HttpFrontend::Impl {
  Server* server;
  absl::StatusOr<ChatSource> chat_source = absl::NotFoundError("no chat template");
  std::optional<ChatTemplate> chat_template;  // parsed once at start
  httplib::Server http;
  std::thread thread;
  int port = 0;

  void Handle(const httplib::Request& req, httplib::Response& res, bool chat);
};

absl::StatusOr<HttpRequestBody> ParseHttpRequestBody(const std::string& body, bool chat, const std::string& model,
                                                     const ChatTemplate* chat_template,
                                                     const absl::StatusOr<ChatSource>& chat_source) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Bad("body", "not a JSON object");
  if (j.contains("model") && j["model"].is_string() && j["model"] != model) {
    return absl::NotFoundError(absl::StrCat("model: '", j["model"].get<std::string>(),
                                            "' is not served here; this server serves '", model, "'"));
  }
  HttpRequestBody b;
  ServeRequest& r = b.request;
  RETURN_IF_ERROR(ParseCommon(j, chat, &r, &b.stream, &b.usage_in_stream));
  if (chat) {
    if (chat_template == nullptr) {
      return Bad("messages", absl::StrCat("this model has no chat template usable here (",
                                          chat_source.status().message(), "); use /v1/completions"));
    }
    ASSIGN_OR_RETURN(const std::vector<ChatMessage> messages, ParseMessages(j));
    auto text = chat_template->Render(messages, /*add_generation_prompt=*/true, chat_source->bos_token, chat_source->eos_token);
    if (!text.ok()) return Bad("messages", std::string(text.status().message()));
    r.prompt = *std::move(text);
    r.templated = true;
  } else {
    RETURN_IF_ERROR(ParsePrompt(j, &r));
  }
  return b;
}

namespace {

// A choice: completions carry `text`; chat carries `message` (whole) or `delta` (streamed).
json ChoiceJson(bool chat, const std::string& text, bool delta, json finish, bool first) {
  json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", std::move(finish)}};
  if (!chat) {
    c["text"] = text;
  } else if (!delta) {
    c["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    c["delta"] = first ? json{{"role", "assistant"}, {"content", text}} : json{{"content", text}};
  }
  return c;
}

json UsageJson(const RequestOutput& out) {
  const int32_t n = static_cast<int32_t>(out.tokens.size());
  return json{{"prompt_tokens", out.prompt_tokens}, {"completion_tokens", n}, {"total_tokens", out.prompt_tokens + n},
              {"prompt_tokens_details", {{"cached_tokens", out.cached_prompt_tokens}}}};
}

}  // namespace

void HttpFrontend::Impl::Handle(const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string model = server->options().model_name;
  auto parsed = ParseHttpRequestBody(req.body, chat, model, chat_template.has_value() ? &*chat_template : nullptr,
                                     chat_source);
  if (!parsed.ok()) return SendError(res, parsed.status());
  const ServeRequest& r = parsed->request;
  const bool stream = parsed->stream, usage_in_stream = parsed->usage_in_stream;
  auto admitted = server->Submit(r);
  if (!admitted.ok()) return SendError(res, admitted.status());

  const std::string id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", admitted->id);
  const int64_t created = std::time(nullptr);
  const char* object = chat ? "chat.completion" : "text_completion";
  const char* chunk_object = chat ? "chat.completion.chunk" : "text_completion";
  auto choice_of = [chat](const std::string& text, bool delta, json finish, bool first) {
    return ChoiceJson(chat, text, delta, std::move(finish), first);
  };
  // A client that goes away aborts its request, which frees its KV blocks: a non-streamed one is
  // checked after every delta (each step that gives it tokens) and every 20 ms while it waits; a
  // streamed one also when a write fails.
  const int conn_fd = ConnectionSocket(req);
  const auto poll_every = std::chrono::milliseconds(conn_fd >= 0 ? 20 : 1000);
  if (!stream) {
    std::string text;
    for (;;) {
      auto d = admitted->stream->Next(poll_every);
      if (conn_fd >= 0 && (!d || !d->finished) && PeerClosed(conn_fd)) {
        server->Cancel(admitted->id);
        res.status = 499;  // nginx's "client closed request"; nobody reads it
        return;
      }
      if (!d) continue;
      if (!d->error.ok()) return SendError(res, d->error);
      text += d->text;
      if (!d->finished) continue;
      json choice = choice_of(text, false, FinishName(d->final.finish), false);
      res.set_content(json{{"id", id}, {"object", object}, {"created", created}, {"model", model},
                           {"choices", {choice}}, {"usage", UsageJson(d->final)}}
                          .dump(-1, ' ', false, json::error_handler_t::replace),
                      "application/json");
      return;
    }
  }
  Server* srv = server;
  const RequestId rid = admitted->id;
  auto rs = admitted->stream;
  auto first = std::make_shared<bool>(true);
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink& sink) {
        auto d = rs->Next(poll_every);
        if (!d) return conn_fd < 0 || !PeerClosed(conn_fd);  // nothing yet: called again, unless the client left
        auto send = [&](const json& chunk) {
          const std::string line = "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        json choice = choice_of(d->text, true, d->finished ? json(FinishName(d->final.finish)) : json(nullptr), *first);
        *first = false;
        if (!send({{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model}, {"choices", {choice}}})) {
          return false;  // the client went away: the releaser aborts the request
        }
        if (!d->finished) return true;
        if (usage_in_stream) {
          send({{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model}, {"choices", json::array()},
                {"usage", UsageJson(d->final)}});
        }
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      },
      [srv, rid](bool success) {
        if (!success) srv->Cancel(rid);
      });
}

HttpFrontend::HttpFrontend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpFrontend::~HttpFrontend() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(Server* server, const HttpOptions& options,
                                                                  absl::StatusOr<ChatSource> chat) {
  const std::string& host = options.host;
  const int port = options.port, threads = options.threads;
  const size_t max_request_bytes = options.max_request_bytes;
  if (!options.security.api_key.empty() || options.security.tls()) {
    return absl::UnimplementedError("--api-key and --ssl-*: not supported yet on HTTP");
  }
  auto impl = std::make_unique<Impl>();
  impl->server = server;
  if (chat.ok()) {
    // A template the renderer cannot parse leaves chat off (with the reason), not the server.
    auto t = ChatTemplate::Parse(chat->template_text);
    if (t.ok()) {
      impl->chat_template = *std::move(t);
    } else {
      chat = absl::InvalidArgumentError(absl::StrCat(chat->origin, ": ", t.status().message()));
      std::fprintf(stderr, "[specula] chat disabled: %s\n", std::string(chat.status().message()).c_str());
    }
  }
  impl->chat_source = std::move(chat);
  Impl* p = impl.get();
  httplib::Server& h = impl->http;
  h.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  h.set_keep_alive_timeout(2);  // an idle keep-alive connection holds a thread
  // A larger Content-Length is refused (413) without keeping the body: httplib reads past it.
  h.set_payload_max_length(max_request_bytes);
  h.Post("/v1/completions", [p](const httplib::Request& q, httplib::Response& s) { p->Handle(q, s, false); });
  h.Post("/v1/chat/completions", [p](const httplib::Request& q, httplib::Response& s) { p->Handle(q, s, true); });
  h.Get("/v1/models", [p](const httplib::Request&, httplib::Response& s) {
    const json m = {{"id", p->server->options().model_name}, {"object", "model"}, {"created", std::time(nullptr)},
                    {"owned_by", "specula"}, {"max_model_len", p->server->scheduler_config().max_model_len}};
    s.set_content(json{{"object", "list"}, {"data", {m}}}.dump(), "application/json");
  });
  h.Get("/health", [p](const httplib::Request&, httplib::Response& s) {
    if (p->server->draining()) return SendError(s, absl::UnavailableError("draining"));
    s.status = 200;
  });
  h.Get("/metrics", [p](const httplib::Request&, httplib::Response& s) {
    s.set_content(p->server->MetricsText(), "text/plain; version=0.0.4; charset=utf-8");
  });
  h.set_error_handler([max_request_bytes](const httplib::Request& q, httplib::Response& s) {
    if (s.status == 404 && s.body.empty()) SendError(s, absl::NotFoundError(absl::StrCat("no route ", q.method, " ", q.path)));
    if (s.status == 413 && s.body.empty()) {
      const std::string msg = absl::StrCat("body: larger than --max-request-bytes ", max_request_bytes);
      s.set_content(json{{"error", {{"message", msg}, {"type", "invalid_request_error"}, {"param", "body"}, {"code", 413}}}}.dump(),
                    "application/json");
    }
  });
  // httplib listens with a backlog of 5: a burst of new connections overflows it and clients stall
  // for a retransmit (~1 s). Keep the socket to listen again with a deep backlog. SO_REUSEADDR
  // (not httplib's SO_REUSEPORT: a second server on a taken port must fail).
  int listen_fd = -1;
  h.set_socket_options([&listen_fd](int fd) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = fd;
  });
  impl->port = port == 0 ? h.bind_to_any_port(host) : (h.bind_to_port(host, port) ? port : -1);
  if (impl->port <= 0) {
    return absl::UnavailableError(absl::StrCat("--http-port: cannot listen on ", host, ":", port, " (in use, or a bad --host)"));
  }
  if (listen_fd >= 0) ::listen(listen_fd, 4096);
  impl->thread = std::thread([p] { p->http.listen_after_bind(); });
  return std::unique_ptr<HttpFrontend>(new HttpFrontend(std::move(impl)));
}

int HttpFrontend::port() const { return impl_->port; }

void HttpFrontend::Stop() {
  if (!impl_->thread.joinable()) return;
  impl_->http.stop();
  impl_->thread.join();
}

}  // namespace specula

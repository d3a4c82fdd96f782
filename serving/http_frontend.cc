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
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "serving/openai_api.h"

namespace specula {
namespace {

using json = nlohmann::json;

// OpenAI's error shape (openai_api.h).
void SendError(httplib::Response& res, const absl::Status& st) {
  res.status = HttpStatusOf(st);
  res.set_content(ErrorJson(st, res.status), "application/json");
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

void HttpFrontend::Impl::Handle(const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string model = server->options().model_name;
  auto parsed = ParseHttpRequestBody(req.body, chat, model, chat_template.has_value() ? &*chat_template : nullptr,
                                     chat_source);
  if (!parsed.ok()) return SendError(res, parsed.status());
  auto started = server->Generate(parsed->request);
  if (!started.ok()) return SendError(res, started.status());
  std::shared_ptr<Generation> gen = *std::move(started);
  auto responder = std::make_shared<OpenAiResponder>(*parsed, model, absl::StrCat(chat ? "chatcmpl-" : "cmpl-", gen->id()),
                                                     *gen, &server->tokenizer());
  // A client that goes away aborts its request, which frees its KV blocks: a non-streamed one is
  // checked after every delta (each step that gives it tokens) and every 20 ms while it waits; a
  // streamed one also when a write fails.
  const int conn_fd = ConnectionSocket(req);
  const auto poll_every = std::chrono::milliseconds(conn_fd >= 0 ? 20 : 1000);
  if (!parsed->stream) {
    for (;;) {
      auto e = gen->Next(poll_every);
      if (conn_fd >= 0 && !responder->done() && PeerClosed(conn_fd)) {
        gen->Cancel();
        res.status = 499;  // nginx's "client closed request"; nobody reads it
        return;
      }
      if (!e) continue;
      auto bytes = responder->Add(e->index, e->delta);
      if (!bytes.ok()) return SendError(res, bytes.status());  // dropping gen cancels the other samples
      if (responder->done()) return res.set_content(*bytes, "application/json");
    }
  }
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink& sink) {
        auto e = gen->Next(poll_every);
        if (!e) return conn_fd < 0 || !PeerClosed(conn_fd);  // nothing yet: called again, unless the client left
        const std::string bytes = responder->Add(e->index, e->delta).value_or("");
        if (!bytes.empty() && !sink.write(bytes.data(), bytes.size())) return false;  // gone: the releaser cancels
        if (responder->done()) sink.done();
        return true;
      },
      [gen](bool success) {
        if (!success) gen->Cancel();
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

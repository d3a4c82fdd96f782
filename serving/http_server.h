// An event-driven HTTP/1.1 server (Boost.Beast's parser on Boost.Asio, whose types stay in
// http_server.cc): a connection costs memory, never a thread, whether it is idle, slow or half
// open. One or two io threads read, parse and write every connection; handlers run on a small
// worker pool and may answer later from any thread (an engine loop's callback). Per connection:
// keep-alive, header/body/idle deadlines, a header size limit (431), a body limit checked from
// Content-Length before the body is read (413), the API key (401) before the body is read, TLS.
// Errors are OpenAI's JSON shape ({"error": {"message", "type", "param", "code"}}).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "serving/security.h"

namespace specula {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                                   // 0: a free port (see HttpServer::port())
  size_t max_header_bytes = size_t{16} << 10;     // request line + headers; larger: 431
  size_t max_body_bytes = size_t{8} << 20;        // larger: 413, never read
  std::string max_body_name = "the body limit";   // how a 413 names the limit (a flag)
  std::chrono::milliseconds header_timeout{10000};  // from a request's first byte to its blank line
  std::chrono::milliseconds body_timeout{60000};    // from the headers to the body's last byte
  std::chrono::milliseconds idle_timeout{30000};    // keep-alive wait; also a stalled response write
  int io_threads = 1;
  int worker_threads = 4;                         // run the handlers
  SecurityOptions security;                       // API key and TLS
  std::vector<std::string> open_paths = {"/health", "/live", "/metrics"};  // no API key needed (as vLLM)
  // On every response: a handler's answer or stream, an early refusal (400, 401, 404, 405, 413, 431), the
  // 500 of a handler that never answered. Values must be header-safe (no CR or LF).
  HttpHeaders response_headers;
};

struct HttpRequest {
  std::string method, path, query, body;  // path without the query; query without the '?'
  HttpHeaders headers;                    // names in lower case
  std::string Header(std::string_view name) const;  // "" if absent; `name` in lower case
};

// One request's response. Every method may be called from any thread; each is queued to the
// connection and never blocks. A response is either Respond (once) or StartStream, Write..., End.
// A handler that drops its last reference without answering gets a 500 (or its stream ended).
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual void Respond(int status, std::string content_type, std::string body, HttpHeaders extra = {}) = 0;
  // Chunked transfer (SSE), with `extra` headers besides the server's.
  virtual void StartStream(int status, std::string content_type, HttpHeaders extra = {}) = 0;
  virtual bool Write(std::string chunk) = 0;  // false once the peer is gone (or the stream ended)
  virtual void End() = 0;
  // `f` runs once if the peer goes away (or the connection breaks, or the server stops) before the
  // response ended: on an io thread, so keep it short; at once if that already happened.
  virtual void OnClose(std::function<void()> f) = 0;
  virtual bool peer_gone() const = 0;
  // Runs `f` soon on the server's handler pool, never on the caller's thread: how a caller on a
  // thread that must not wait (the engine loop) hands off work such as formatting a response.
  // Dropped once the server stops.
  virtual void Defer(std::function<void()> f) = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpExchange>)>;

struct HttpRoute {
  std::string method, path;  // exact path match
  HttpHandler handler;
};

// OpenAI's error body: {"error": {"message", "type", "param" (null if empty), "code": status}}.
std::string HttpErrorJson(int status, std::string_view message, std::string_view type, std::string_view param = "");

class HttpServer {
 public:
  // Binds and listens (backlog 4096, SO_REUSEADDR but not SO_REUSEPORT: a taken port is an error)
  // and raises the process's open-file soft limit to its hard limit (a connection is a descriptor).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options, std::vector<HttpRoute> routes);
  ~HttpServer();  // Stop()
  int port() const;
  // Sets (or adds) a header that every response from now on carries (HttpServerOptions::
  // response_headers); a handler's header of the same name wins. Thread-safe.
  void SetResponseHeader(const std::string& name, const std::string& value);
  // Stops accepting, waits for running handlers, closes every connection (OnClose fires for the
  // unfinished responses) and joins the threads. Later calls on exchanges do nothing.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula

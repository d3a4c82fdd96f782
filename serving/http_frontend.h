// The OpenAI-compatible HTTP front end of `specula serve` (on HttpServer, serving/http_server.h:
// connections cost no thread): POST /v1/completions and /v1/chat/completions (server-sent events with
// "stream": true, ending in `data: [DONE]`), GET /v1/models, /health (503 while draining) and
// /metrics (Prometheus text), POST /reset_prefix_cache (vLLM's: the local prefix cache emptied,
// {"reset": true, "blocks": N}), POST /admin/reload (Server::Reload). Errors use OpenAI's JSON error
// shape: 400 bad input, 401 without the API key, 403 an admin route on a server without a key, 404
// unknown model or route, 409 a reload the server's state refuses, 413 too large a body, 429
// overload, 503 draining. Every response carries X-Specula-Replica (ServeOptions::replica_id) where
// the server has an id, and X-Specula-Model-Version: a generation's own model's, else the current.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "chat/chat.h"
#include "serving/security.h"
#include "serving/server.h"

namespace specula {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 0;                 // 0: a free port (see port())
  int threads = 4;              // handler threads: parse, render and tokenize requests
  size_t max_request_bytes = size_t{8} << 20;  // a larger body is a 413, never parsed
  SecurityOptions security;
};

class HttpFrontend {
 public:
  // Listens on options.host:port. Chat requests use the chat template of the model they are bound
  // to (ModelBundle::chat_template).
  static absl::StatusOr<std::unique_ptr<HttpFrontend>> Start(Server* server, const HttpOptions& options);
  ~HttpFrontend();  // stops listening; open streams end first
  int port() const;
  void Stop();

  struct Impl;

 private:
  explicit HttpFrontend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula

// The gRPC front end of `specula serve`: specula.v1.Generation and specula.v1.Admin (Reload; only
// with an API key) from proto/specula/v1/generation.proto, grpc.health.v1.Health and server
// reflection. Health answers readiness for the server ("") and
// for specula.v1.Generation (SERVING, NOT_SERVING while draining), and liveness for the service
// name kLivenessService (SERVING while the process serves, draining included: a kubelet's liveness
// probe must not kill a pod that is finishing its requests). Every
// Generation call's initial metadata has x-specula-replica (ServeOptions::replica_id) where the
// server has an id. gRPC types stay in grpc_frontend.cc.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "serving/security.h"
#include "serving/server.h"

namespace specula {

// A serialized specula.v1.GenerateRequest as the Generate call hands it to Server::Submit (proto3's
// unset fields mapped to the defaults). INVALID_ARGUMENT when the bytes are not such a message
// (gRPC itself answers those before the call starts).
absl::StatusOr<ServeRequest> ParseGenerateRequest(const std::string& bytes);

inline constexpr char kLivenessService[] = "liveness";

class GrpcFrontend {
 public:
  // Listens on host:port (0: a free port; see port()). `server` must outlive the front end.
  // `security`: an API key for specula.v1.Generation (health and reflection stay open) and TLS
  // (with client certificates under ssl_ca_certs); a bad PEM file is INVALID_ARGUMENT naming its flag.
  static absl::StatusOr<std::unique_ptr<GrpcFrontend>> Start(Server* server, const std::string& host, int port,
                                                             const SecurityOptions& security = {});
  ~GrpcFrontend();
  int port() const;
  // Readiness: the server's health ("") and specula.v1.Generation's, SERVING or NOT_SERVING.
  // kLivenessService stays SERVING.
  void SetServing(bool serving);
  // Stops taking calls; calls still open after `grace` are cancelled. Needs the engine loop running
  // (a cancelled stream ends when its aborted last delta arrives).
  void Shutdown(std::chrono::milliseconds grace);

  struct Impl;

 private:
  explicit GrpcFrontend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula

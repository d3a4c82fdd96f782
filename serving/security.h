// What guards `specula serve`'s two front ends alike: an API key (HTTP `Authorization: Bearer KEY`,
// gRPC `authorization: Bearer KEY` metadata) and TLS from PEM files. As in vLLM, the key guards the
// API routes and RPCs only: /health, gRPC health and /metrics stay open for probes and scrapers.
// No gRPC, HTTP or TLS types here.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace specula {

struct SecurityOptions {
  std::string api_key;       // empty: no key (--api-key or $SPECULA_API_KEY)
  std::string ssl_certfile;  // PEM certificate chain; with ssl_keyfile: TLS on both protocols
  std::string ssl_keyfile;   // PEM private key
  std::string ssl_ca_certs;  // PEM CA bundle: clients must present a certificate it signed

  bool tls() const { return !ssl_certfile.empty(); }
};

// Checks the options before anything listens: the TLS files must come as a pair and be readable;
// errors name the flag and the file.
absl::Status ValidateSecurityOptions(const SecurityOptions& s);

// Whether an `Authorization` header value (or gRPC metadata value) carries `key` as a bearer token
// ("Bearer KEY", scheme case-insensitive). Takes the same time for every presented value of a given
// length and for every key of a given length, so a wrong key's timing says nothing of the right one.
bool BearerMatches(std::string_view authorization, std::string_view key);

}  // namespace specula

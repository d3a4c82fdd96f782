// The PEM files of `--ssl-certfile`, `--ssl-keyfile` and `--ssl-ca-certs`, read and checked with
// OpenSSL before a front end hands them to its TLS library, so that a bad file is an error naming
// its flag at startup rather than a listener that fails without saying why. No OpenSSL types here.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "serving/security.h"

namespace specula {

struct TlsFiles {
  std::string cert_chain;   // PEM: the server's certificate, then its chain
  std::string private_key;  // PEM: the certificate's private key
  std::string ca_certs;     // PEM: the CAs that sign client certificates; empty: none asked for
};

// Reads the files of `s` (s.tls() must hold). INVALID_ARGUMENT naming the flag and file when one
// holds no PEM certificate (or key), a block does not parse, or the key is not the certificate's.
absl::StatusOr<TlsFiles> ReadTlsFiles(const SecurityOptions& s);

}  // namespace specula

#include "serving/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace specula {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;

absl::Status Bad(const char* flag, const std::string& path, const std::string& what) {
  ERR_clear_error();  // OpenSSL's queue says the same less clearly; leave it empty for the next user
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, ": ", what));
}

absl::StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Bad(flag, path, "cannot read");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Never prompts for a passphrase (OpenSSL's default callback reads the terminal): an encrypted key
// does not parse.
int NoPassphrase(char*, int, int, void*) { return 0; }

Bio MemBio(const std::string& pem) { return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

// Every certificate in `pem` (at least one); the first one returned for the key check.
absl::StatusOr<Cert> ParseCerts(const char* flag, const std::string& path, const std::string& pem) {
  if (pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    return Bad(flag, path, "no PEM certificate (-----BEGIN CERTIFICATE-----) in the file");
  }
  ERR_clear_error();
  Bio bio = MemBio(pem);
  Cert first;
  int count = 0;
  while (Cert c{PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)}) {
    if (first == nullptr) first = std::move(c);
    ++count;
  }
  // The loop ends at the end of the input (PEM_R_NO_START_LINE) or at a block that does not parse.
  const unsigned long err = ERR_peek_last_error();
  if (count == 0 || (err != 0 && ERR_GET_REASON(err) != PEM_R_NO_START_LINE)) {
    return Bad(flag, path, absl::StrCat("certificate ", count + 1, " does not parse as PEM X.509"));
  }
  ERR_clear_error();
  return first;
}

}  // namespace

absl::StatusOr<TlsFiles> ReadTlsFiles(const SecurityOptions& s) {
  TlsFiles out;
  auto cert = ReadFile("--ssl-certfile", s.ssl_certfile);
  if (!cert.ok()) return cert.status();
  out.cert_chain = *std::move(cert);
  auto first = ParseCerts("--ssl-certfile", s.ssl_certfile, out.cert_chain);
  if (!first.ok()) return first.status();

  auto key = ReadFile("--ssl-keyfile", s.ssl_keyfile);
  if (!key.ok()) return key.status();
  out.private_key = *std::move(key);
  ERR_clear_error();
  Bio bio = MemBio(out.private_key);
  std::unique_ptr<EVP_PKEY, KeyFree> pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  if (pkey == nullptr) {
    return Bad("--ssl-keyfile", s.ssl_keyfile, "no unencrypted PEM private key in the file");
  }
  if (X509_check_private_key(first->get(), pkey.get()) != 1) {
    return Bad("--ssl-keyfile", s.ssl_keyfile, absl::StrCat("not the key of --ssl-certfile ", s.ssl_certfile));
  }

  if (!s.ssl_ca_certs.empty()) {
    auto ca = ReadFile("--ssl-ca-certs", s.ssl_ca_certs);
    if (!ca.ok()) return ca.status();
    out.ca_certs = *std::move(ca);
    auto ca_first = ParseCerts("--ssl-ca-certs", s.ssl_ca_certs, out.ca_certs);
    if (!ca_first.ok()) return ca_first.status();
  }
  return out;
}

}  // namespace specula

#include "serving/security.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace specula {

absl::Status ValidateSecurityOptions(const SecurityOptions& s) {
  if (s.ssl_certfile.empty() != s.ssl_keyfile.empty()) {
    return absl::InvalidArgumentError("--ssl-certfile and --ssl-keyfile: give both or neither");
  }
  if (!s.ssl_ca_certs.empty() && s.ssl_certfile.empty()) {
    return absl::InvalidArgumentError("--ssl-ca-certs: needs --ssl-certfile and --ssl-keyfile (client certificates need TLS)");
  }
  for (auto [flag, path] : {std::pair<const char*, const std::string&>{"--ssl-certfile", s.ssl_certfile},
                            {"--ssl-keyfile", s.ssl_keyfile}, {"--ssl-ca-certs", s.ssl_ca_certs}}) {
    if (path.empty()) continue;
    std::ifstream f(path);
    if (!f) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  }
  return absl::OkStatus();
}

bool BearerMatches(std::string_view authorization, std::string_view key) {
  constexpr std::string_view kScheme = "bearer ";
  if (key.empty() || authorization.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
  }
  const std::string_view presented = authorization.substr(kScheme.size());
  // Every byte of the key is compared, whatever the presented value: no early exit on a mismatch.
  unsigned char diff = presented.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(key[i]));
  }
  return diff == 0;
}

}  // namespace specula

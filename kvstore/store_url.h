// Where the shared KV block store is: the `--kv-store` URL, parsed once at startup.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace specula {

struct KvStoreUrl {
  std::string host;      // tcp; empty for a unix socket
  int port = 6379;
  std::string path;      // unix socket path; empty for tcp
  std::string password;  // AUTH when non-empty
  int db = 0;            // SELECT when non-zero
  // The URL with the password replaced by "***", for logs and errors.
  std::string Redacted() const;
};

// redis://[:PASSWORD@]HOST[:PORT][/DB] or unix:///PATH[?db=N][&password=PASSWORD]. HOST may be an
// IPv6 address in brackets; the password is percent-decoded. Errors start with "--kv-store: ", say
// what is wrong and never echo the password: "rediss://" is refused by name (Debian's hiredis 0.14
// has no TLS), as are any other scheme, a user name, a bad port and a bad db.
absl::StatusOr<KvStoreUrl> ParseKvStoreUrl(std::string_view url);

}  // namespace specula

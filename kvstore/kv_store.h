// The shared KV block store as the engine sees it: values by key, batched. Redis behind it
// (redis_store.cc, the one file that sees hiredis); no hiredis type in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvstore/store_url.h"

namespace specula {

struct KvStoreOptions {
  KvStoreUrl url;
  double timeout_ms = 200;                  // each command's read/write timeout, and the connect timeout
  int64_t ttl_s = 3600;                     // every written value expires (SET ... EX ttl_s)
  int64_t max_pending_bytes = 256ll << 20;  // writes queued beyond this are dropped and counted
};

// One connection, used by one thread. Reconnects on the next call after a failure, at most once
// per second (so a down store costs each caller nothing but a fast error meanwhile).
class KvStore {
 public:
  // Redis: connect, AUTH, SELECT, PING. Fails fast when the store is down: a missing unix socket or
  // a refused connection at once, an unresponsive store after timeout_ms.
  static absl::StatusOr<std::unique_ptr<KvStore>> Connect(const KvStoreOptions& o);
  // The same store, connecting on its first call instead (a store down at startup is then one more
  // fast error). Errors: only options out of range, as Connect's.
  static absl::StatusOr<std::unique_ptr<KvStore>> ConnectLazily(const KvStoreOptions& o);
  virtual ~KvStore() = default;
  // Values of `keys` in order (one MGET); nullopt where a key is missing. Errors: a timeout
  // (absl::DeadlineExceededError), a connection failure (UnavailableError). No keys: no command,
  // only the connection made sure of.
  virtual absl::StatusOr<std::vector<std::optional<std::string>>> Get(absl::Span<const std::string> keys) = 0;
  // Pipelined SET key value EX ttl_s for each pair, one round trip. ttl_s must be > 0.
  virtual absl::Status Set(absl::Span<const std::pair<std::string, std::string>> items, int64_t ttl_s) = 0;
};

}  // namespace specula

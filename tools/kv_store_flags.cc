#include "tools/kv_store_flags.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kvstore/kv_transfer.h"
#include "model/weights_hash.h"

namespace specula {

const std::set<std::string> kKvStoreFlags = {"kv-store", "kv-store-timeout-ms", "kv-store-ttl-s",
                                             "kv-store-max-pending-mb"};

const char kKvStoreFlagsHelp[] = R"(
Shared KV (a conversation's history computed once for every replica; docs/kv_store.md):
  --kv-store URL        redis://[:PASSWORD@]HOST:PORT[/DB] or unix:///PATH[?db=N]: full KV blocks
                        are written there as they are computed, and a request's prompt blocks
                        missing here are fetched from there before it runs. Keys carry a hash of
                        everything that changes a block's bits (weights, dtypes, block size,
                        kernels) and the request's cache_salt. A bad URL is an error; a store that
                        is down at startup or later is a warning and a metric: requests recompute.
                        rediss:// is refused (no TLS in Debian's hiredis). Not with
                        --tensor-parallel-size > 1 or --device cuda
  --kv-store-timeout-ms MS  each store command's timeout (default 200)
  --kv-store-ttl-s S    how long a written block lives in the store (default 3600)
  --kv-store-max-pending-mb MB  writes queued beyond this are dropped and counted (default 256)
)";

absl::StatusOr<std::optional<KvStoreOptions>> ReadKvStoreFlags(const Flags& flags) {
  auto it = flags.values.find("kv-store");
  if (it == flags.values.end()) {
    for (const std::string& f : kKvStoreFlags) {
      if (flags.values.count(f)) return absl::InvalidArgumentError(absl::StrCat("--", f, " needs --kv-store"));
    }
    return std::nullopt;
  }
  KvStoreOptions o;
  ASSIGN_OR_RETURN(o.url, ParseKvStoreUrl(it->second));
  int64_t pending_mb = o.max_pending_bytes >> 20;
  RETURN_IF_ERROR(GetNumber(flags, "kv-store-timeout-ms", &o.timeout_ms));
  RETURN_IF_ERROR(GetNumber(flags, "kv-store-ttl-s", &o.ttl_s));
  RETURN_IF_ERROR(GetNumber(flags, "kv-store-max-pending-mb", &pending_mb));
  if (!(o.timeout_ms > 0 && o.timeout_ms <= 60000)) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-store-timeout-ms: ", o.timeout_ms, " is not in (0, 60000]"));
  }
  if (o.ttl_s < 1) return absl::InvalidArgumentError(absl::StrCat("--kv-store-ttl-s: ", o.ttl_s, " is not >= 1"));
  if (pending_mb < 1 || pending_mb > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-store-max-pending-mb: ", pending_mb, " is not in [1, 1048576]"));
  }
  o.max_pending_bytes = pending_mb << 20;
  return o;
}

absl::Status AttachKvStore(const LoadedEngine& e, const KvStoreOptions& options, Engine* engine) {
  const TargetOptions& t = e.options.target;
  if (t.tensor_parallel_size > 1) {
    return absl::InvalidArgumentError("--kv-store: not with --tensor-parallel-size > 1 (each rank holds a share of a block)");
  }
  if (t.device != "cpu") return absl::InvalidArgumentError(absl::StrCat("--kv-store: not with --device ", t.device));
  std::string description;
  ASSIGN_OR_RETURN(std::string salt, KvReplicaSalt(e, engine->scheduler().config().block_size,
                                                   DefaultWeightsHashCacheDir(), &description));
  if (absl::StatusOr<std::unique_ptr<KvStore>> probe = KvStore::Connect(options); !probe.ok()) {
    std::fprintf(stderr, "[specula] warning: --kv-store %s does not answer (%s); requests recompute until it does\n",
                 options.url.Redacted().c_str(), std::string(probe.status().message()).c_str());
  }
  RETURN_IF_ERROR(engine->AttachKvStore(std::make_unique<KvTransfer>(options), salt));
  std::fprintf(stderr, "[specula] kv-store %s: blocks keyed by %s (%s)\n", options.url.Redacted().c_str(), salt.c_str(),
               description.c_str());
  return absl::OkStatus();
}

}  // namespace specula

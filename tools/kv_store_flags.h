// `specula serve`'s shared KV flags (--kv-store and its bounds): reading them, and attaching the
// store to the engine it serves (Engine::AttachKvStore).
#pragma once

#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "core/flags.h"
#include "engine/engine_setup.h"
#include "kvstore/kv_store.h"

namespace specula {

extern const std::set<std::string> kKvStoreFlags;
extern const char kKvStoreFlagsHelp[];

// nullopt without --kv-store. Errors name the flag: a URL that does not parse (rediss:// among
// them), a bound out of range, a bound without --kv-store.
absl::StatusOr<std::optional<KvStoreOptions>> ReadKvStoreFlags(const Flags& flags);

// Attaches the store to `engine`, keyed by the replica's salt (KvReplicaSalt). Refused by name under
// tensor parallelism and on a device. A store that does not answer now is a warning on stderr,
// not an error: requests recompute until it does.
absl::Status AttachKvStore(const LoadedEngine& e, const KvStoreOptions& options, Engine* engine);

}  // namespace specula

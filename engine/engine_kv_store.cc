// Shared KV through a store (--kv-store, kvstore/): a request's missing prompt blocks are fetched off
// the engine's thread and installed between steps as cached blocks that the scheduler's prefix match
// finds; committed blocks are copied out on the engine's thread and written behind the request,
// whose last delta waits until they are in.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "kvstore/block_codec.h"

namespace specula {
namespace {

// Hashes the store knows from this engine; past this the set starts again (a write or two more).
constexpr size_t kMaxKnownBlocks = 1 << 20;

}  // namespace

absl::Status Engine::AttachKvStore(std::unique_ptr<KvTransfer> transfer, const std::string& replica_salt) {
  if (!kv_.on_host()) return absl::FailedPreconditionError("--kv-store: the KV pool is in device memory");
  if (!scheduler_.config().enable_prefix_caching) {
    return absl::InvalidArgumentError("--kv-store needs the prefix cache (drop --no-prefix-caching)");
  }
  store_.transfer = std::move(transfer);
  store_.key_prefix = absl::StrCat("specula:kv:v1:", replica_salt, ":");
  return absl::OkStatus();
}

int32_t Engine::ResetPrefixCache() { return scheduler_.mutable_blocks().ResetPrefixCache(); }

bool Engine::FetchFirst(RequestRecord& r, NewSequence& n) {
  if (store_.transfer == nullptr || n.skip_prefix_cache) return false;
  const int32_t len = static_cast<int32_t>(n.prompt.size());
  // The prefix match leaves the last prompt token out (its logits are computed), so do the fetches.
  std::vector<BlockHash> chain = ChainHashes(n.salt_root, n.prompt, len - 1, scheduler_.config().block_size);
  const int32_t local = scheduler_.blocks().CachedBlocks(chain);
  if (local >= static_cast<int32_t>(chain.size())) return false;
  std::vector<std::string> keys;  // [chain.size() - local]
  for (size_t b = local; b < chain.size(); ++b) keys.push_back(StoreKey(chain[b]));
  store_.fetches[store_.transfer->Fetch(std::move(keys))] = n.id;
  r.kv_store.chain = std::move(chain);
  r.kv_store.from_block = local;
  r.kv_store.fetch_start_ms = NowMs();
  r.kv_store.admit = std::move(n);
  return true;
}

void Engine::InstallFetched() {
  if (store_.transfer == nullptr || store_.fetches.empty()) return;
  for (KvFetchResult& f : store_.transfer->TakeFetched()) {
    auto ticket = store_.fetches.find(f.ticket);
    if (ticket == store_.fetches.end()) continue;
    const RequestId id = ticket->second;
    store_.fetches.erase(ticket);
    auto it = records_.find(id);
    if (it == records_.end() || it->second->aborted) continue;  // aborted while it was fetched
    RequestRecord& r = *it->second;
    RequestOutput& out = r.output.out;
    out.kv_fetch_ms = NowMs() - r.kv_store.fetch_start_ms;
    const double start = clock_->NowSeconds();
    out.kv_store_tokens = InstallBlocks(r, f.values) * scheduler_.config().block_size;
    out.kv_install_ms = (clock_->NowSeconds() - start) * 1000.0;
    stats_.kv_install_seconds += out.kv_install_ms / 1000.0;
    r.kv_store.admit->arrival_ms = NowMs();
    // Checked when it was added (Scheduler::Check): the pool and the context have not changed. While
    // `admit` is set, Abort knows the scheduler never ran it.
    if (absl::Status st = scheduler_.Add(std::move(*r.kv_store.admit), &r); !st.ok()) Abort(id);
    r.kv_store.admit.reset();
  }
}

// The run of fetched blocks that decode, in order from the first; returns how many were installed.
int32_t Engine::InstallBlocks(RequestRecord& r, absl::Span<const std::string> values) {
  const int32_t bs = scheduler_.config().block_size;
  const std::vector<TokenId>& prompt = r.kv_store.admit->prompt;
  const size_t payload_bytes = static_cast<size_t>(KvCache::BlockBytes(model_->config(), bs, kv_.dtype()));
  BlockManager& blocks = scheduler_.mutable_blocks();
  std::vector<BlockId> held;  // [installed]: a ref each until all are in, so none evicts another
  int32_t installed = 0;
  for (size_t j = 0; j < values.size(); ++j) {
    const size_t b = r.kv_store.from_block + j;
    const auto tokens = absl::MakeConstSpan(prompt).subspan(b * bs, bs);
    absl::StatusOr<absl::string_view> payload = DecodeBlock(values[j], tokens, payload_bytes);
    if (!payload.ok()) {
      ++stats_.kv_rejected_blocks;  // corrupt or another's: recomputed
      break;
    }
    std::optional<BlockId> id = blocks.Install(r.kv_store.chain[b], tokens, &held);
    if (!id.has_value()) break;  // the pool is full: the rest is recomputed
    if (*id >= 0 && !kv_.WriteBlock(*id, *payload).ok()) break;
    store_.known.insert(r.kv_store.chain[b]);
    ++installed;
  }
  blocks.Release(&held);
  stats_.kv_installed_blocks += installed;
  return installed;
}

void Engine::StoreCommitted(const StepPlan& plan, const std::vector<std::vector<BlockId>>& tables) {
  const KvStoreStats now = store_.transfer->Stats();
  if (now.errors + now.timeouts != store_.failures_seen || store_.known.size() > kMaxKnownBlocks) {
    store_.known.clear();  // the store may have lost what it had: write again what is committed
    store_.failures_seen = now.errors + now.timeouts;
  }
  const int32_t bs = scheduler_.config().block_size;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    RequestRecord& r = RecordOf(plan.seqs[i]);
    const int32_t full = std::min<int32_t>(r.block_hashes.size(), tables[i].size());
    for (int32_t b = r.kv_store.num_offered; b < full; ++b) {
      if (!store_.known.insert(r.block_hashes[b]).second) continue;
      const auto tokens = absl::MakeConstSpan(r.tokens).subspan(static_cast<size_t>(b) * bs, bs);
      store_.transfer->Write(r.id, StoreKey(r.block_hashes[b]), EncodeBlock(tokens, kv_.BlockPieces(tables[i][b])));
    }
    r.kv_store.num_offered = std::max(r.kv_store.num_offered, full);
  }
}

void Engine::HoldUntilStored(std::vector<RequestDelta>* deltas) {
  if (store_.transfer == nullptr) return;
  stats_.kv_store = store_.transfer->Stats();  // every step publishes: the one place they are copied
  const bool any_last = std::any_of(deltas->begin(), deltas->end(), [](const RequestDelta& d) { return d.finished; });
  if (store_.held.empty() && !any_last) return;
  std::vector<RequestDelta> out;
  std::vector<RequestDelta> still;
  for (RequestDelta& d : store_.held) {
    (store_.transfer->WritesPending(d.id) ? still : out).push_back(std::move(d));
  }
  for (RequestDelta& d : *deltas) {
    (d.finished && store_.transfer->WritesPending(d.id) ? still : out).push_back(std::move(d));
  }
  store_.held = std::move(still);
  *deltas = std::move(out);
}

}  // namespace specula

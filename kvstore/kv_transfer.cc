#include "kvstore/kv_transfer.h"

#include <algorithm>
#include <chrono>


namespace specula {
namespace {

constexpr size_t kFetchChunkKeys = 64;            // keys per MGET; a miss ends the fetch after its chunk
constexpr size_t kWriteBatchValues = 64;          // values per pipelined Set
constexpr int64_t kWriteBatchBytes = 32ll << 20;  // bytes per pipelined Set (at least one value)

double NowS() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

KvTransfer::KvTransfer(KvStoreOptions options) : options_(std::move(options)), thread_([this] { Run(); }) {}

KvTransfer::~KvTransfer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

uint64_t KvTransfer::Fetch(std::vector<std::string> keys) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    fetches_.push_back(PendingFetch{ticket, std::move(keys), NowS()});
  }
  work_cv_.notify_one();
  return ticket;
}

void KvTransfer::Write(uint64_t tag, std::string key, std::string value) {
  auto bytes = static_cast<int64_t>(key.size() + value.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_bytes_ + bytes > options_.max_pending_bytes) {
      ++stats_.dropped_writes;
      return;
    }
    pending_bytes_ += bytes;
    ++tag_writes_[tag];
    writes_.push_back(PendingWrite{tag, std::move(key), std::move(value)});
  }
  work_cv_.notify_one();
}

std::vector<KvFetchResult> KvTransfer::TakeFetched() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KvFetchResult> out;
  out.swap(done_);
  return out;
}

bool KvTransfer::WritesPending(uint64_t tag) const {
  std::lock_guard<std::mutex> lock(mu_);
  return tag_writes_.contains(tag);
}

void KvTransfer::Wait(double max_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_.empty()) return;
  uint64_t seen = events_;
  done_cv_.wait_for(lock, std::chrono::duration<double, std::milli>(std::max(0.0, max_ms)),
                    [&] { return events_ != seen || !done_.empty(); });
}

KvStoreStats KvTransfer::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void KvTransfer::Run() {
  store_ = KvStore::ConnectLazily(options_);
  if (store_.ok()) (*store_)->Get({}).IgnoreError();  // connects early; a store that is down is one fast error
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || !fetches_.empty() || !writes_.empty(); });
    if (!stop_ && !fetches_.empty()) {
      PendingFetch fetch = std::move(fetches_.front());
      fetches_.pop_front();
      lock.unlock();
      DoFetch(std::move(fetch));
      lock.lock();
      continue;
    }
    if (writes_.empty()) break;  // stopping, every write done; queued fetches have no taker left
    std::vector<PendingWrite> batch;
    int64_t batch_bytes = 0;
    while (!writes_.empty() && batch.size() < kWriteBatchValues) {
      auto bytes = static_cast<int64_t>(writes_.front().key.size() + writes_.front().value.size());
      if (!batch.empty() && batch_bytes + bytes > kWriteBatchBytes) break;
      batch_bytes += bytes;
      batch.push_back(std::move(writes_.front()));
      writes_.pop_front();
    }
    lock.unlock();
    DoWrites(std::move(batch));
    lock.lock();
  }
}

absl::StatusOr<KvStore*> KvTransfer::Store() {
  if (!store_.ok()) return store_.status();
  return store_->get();
}

void KvTransfer::CountFailure(const absl::Status& s) {
  if (absl::IsDeadlineExceeded(s)) {
    ++stats_.timeouts;
  } else {
    ++stats_.errors;
  }
}

void KvTransfer::DoFetch(PendingFetch fetch) {
  const std::vector<std::string>& keys = fetch.keys;
  std::vector<std::string> values;  // [longest present run]
  absl::StatusOr<KvStore*> store = Store();
  absl::Status status = keys.empty() ? absl::OkStatus() : store.status();
  bool missed = false;
  for (size_t start = 0; status.ok() && !missed && start < keys.size(); start += kFetchChunkKeys) {
    size_t n = std::min(kFetchChunkKeys, keys.size() - start);
    auto got = (*store)->Get(absl::MakeConstSpan(keys).subspan(start, n));
    if (!got.ok()) {
      status = got.status();
      break;
    }
    for (std::optional<std::string>& v : *got) {
      if (!v.has_value()) {
        missed = true;
        break;
      }
      values.push_back(*std::move(v));
    }
  }
  if (!status.ok()) values.clear();
  int64_t read_bytes = 0;
  for (const std::string& v : values) read_bytes += static_cast<int64_t>(v.size());
  std::lock_guard<std::mutex> lock(mu_);
  KvFetchResult result{fetch.ticket, std::move(values), status, NowS() - fetch.start_s};
  ++stats_.fetches;
  stats_.fetch_seconds += result.seconds;
  if (status.ok()) {
    stats_.hit_blocks += static_cast<int64_t>(result.values.size());
    stats_.miss_blocks += static_cast<int64_t>(keys.size() - result.values.size());
    stats_.read_bytes += read_bytes;
  } else {
    stats_.miss_blocks += static_cast<int64_t>(keys.size());  // none came: each block asked for is recomputed
    CountFailure(status);
  }
  done_.push_back(std::move(result));
  ++events_;
  done_cv_.notify_all();
}

void KvTransfer::DoWrites(std::vector<PendingWrite> batch) {
  std::vector<std::pair<uint64_t, int64_t>> accounts;      // [batch]: (tag, bytes)
  std::vector<std::pair<std::string, std::string>> items;  // [batch]: (key, value)
  int64_t value_bytes = 0;
  for (PendingWrite& w : batch) {
    accounts.emplace_back(w.tag, static_cast<int64_t>(w.key.size() + w.value.size()));
    value_bytes += static_cast<int64_t>(w.value.size());
    items.emplace_back(std::move(w.key), std::move(w.value));
  }
  absl::StatusOr<KvStore*> store = Store();
  absl::Status status = store.ok() ? (*store)->Set(items, options_.ttl_s) : store.status();
  std::lock_guard<std::mutex> lock(mu_);
  if (status.ok()) {
    stats_.writes += static_cast<int64_t>(items.size());
    stats_.written_bytes += value_bytes;
  } else {
    stats_.dropped_writes += static_cast<int64_t>(items.size());
    CountFailure(status);
  }
  for (const auto& [tag, bytes] : accounts) {
    pending_bytes_ -= bytes;
    auto it = tag_writes_.find(tag);
    if (--it->second == 0) {
      tag_writes_.erase(it);
      ++events_;
    }
  }
  done_cv_.notify_all();
}

}  // namespace specula

// The I/O thread that keeps the shared KV block store off the engine's thread: the engine queues
// fetches and writes and never blocks on the store; one thread owns the store's connection.
// Fetches go before writes (a waiting request's first token waits on a fetch; writes only have to
// land before the request's last response). Queues, results and statistics are shared under one mutex.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/kv_store.h"

namespace specula {

struct KvFetchResult {
  uint64_t ticket = 0;
  std::vector<std::string> values;  // the values of keys[0..n): the longest run present from the first
  absl::Status status;              // not ok: timeout/unavailable (values then empty)
  double seconds = 0;               // from Fetch to the result being ready
};

struct KvStoreStats {  // cumulative, a copy
  // miss: the first missing key of each answered fetch and those past it, and every key of a failed
  // fetch (each is a block the engine recomputes)
  int64_t fetches = 0, hit_blocks = 0, miss_blocks = 0;
  // bytes: the values'; dropped: writes refused at max_pending_bytes or lost to a failed round trip
  int64_t read_bytes = 0, written_bytes = 0, writes = 0, dropped_writes = 0;
  int64_t timeouts = 0, errors = 0;  // errors: failures other than timeouts (connection, error replies)
  double fetch_seconds = 0;          // summed over fetches
};

class KvTransfer {
 public:
  // Starts the I/O thread. Connects there; a store that is down only makes fetches fail fast and
  // writes be dropped (counted) until it is back.
  explicit KvTransfer(KvStoreOptions options);
  ~KvTransfer();  // finishes queued writes within options.timeout_ms each, then stops
  KvTransfer(const KvTransfer&) = delete;
  KvTransfer& operator=(const KvTransfer&) = delete;

  // Engine thread: queue a fetch of `keys` (in order); its result comes from TakeFetched.
  uint64_t Fetch(std::vector<std::string> keys);
  // Engine thread: queue a write tagged with `tag` (a request id). Dropped (and counted) when the
  // queued bytes would exceed max_pending_bytes; never blocks.
  void Write(uint64_t tag, std::string key, std::string value);
  // Results of finished fetches, in any order; non-blocking.
  std::vector<KvFetchResult> TakeFetched();
  // Whether writes tagged `tag` are still queued or in flight (a failed write counts as done).
  bool WritesPending(uint64_t tag) const;
  // Waits until a fetch finishes or some tag's writes all complete, at most max_ms (the engine
  // calls it instead of spinning when it has nothing to run but store work). Returns at once while
  // a finished fetch is untaken.
  void Wait(double max_ms);
  KvStoreStats Stats() const;

 private:
  struct PendingFetch {
    uint64_t ticket = 0;
    std::vector<std::string> keys;
    double start_s = 0;
  };
  struct PendingWrite {
    uint64_t tag = 0;
    std::string key;
    std::string value;
  };

  void Run();                                      // the I/O thread
  void DoFetch(PendingFetch fetch);                // I/O thread, mu_ not held
  void DoWrites(std::vector<PendingWrite> batch);  // I/O thread, mu_ not held
  // I/O thread: the store, or why there is none (options out of range).
  absl::StatusOr<KvStore*> Store();
  void CountFailure(const absl::Status& s);  // mu_ held

  const KvStoreOptions options_;
  // I/O thread only: made there, and it connects and reconnects itself.
  absl::StatusOr<std::unique_ptr<KvStore>> store_ = absl::FailedPreconditionError("not started");

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the I/O thread waits for work or stop
  std::condition_variable done_cv_;  // Wait waits for a finished fetch or a tag's last write
  bool stop_ = false;
  uint64_t next_ticket_ = 1;
  uint64_t events_ = 0;  // fetches finished plus tags completed, for Wait
  std::deque<PendingFetch> fetches_;  // [queued fetches], in order
  std::deque<PendingWrite> writes_;   // [queued writes], in order
  int64_t pending_bytes_ = 0;                          // keys and values queued or in flight
  absl::flat_hash_map<uint64_t, int64_t> tag_writes_;  // tag -> writes queued or in flight
  std::vector<KvFetchResult> done_;  // [finished fetches not taken yet]
  KvStoreStats stats_;

  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace specula

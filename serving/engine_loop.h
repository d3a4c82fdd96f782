// The serving step loop: one thread owns the Engine and runs its steps. Any other thread (gRPC and
// HTTP handlers) submits requests, reads each one's output as deltas from its RequestStream (a
// thread-safe queue), and cancels it. Nothing else touches the engine; what other threads may
// read of its state (queue lengths, KV use) is a snapshot the loop publishes after every step.
// No gRPC or HTTP types here.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/engine.h"

namespace specula {

// One request's deltas, in order. Written by the loop thread, read by one reader.
class RequestStream {
 public:
  explicit RequestStream(RequestId id) : id_(id) {}
  RequestId id() const { return id_; }
  // The next delta, waiting at most `timeout`; nullopt if none came by then, or after the last.
  std::optional<RequestDelta> Next(std::chrono::milliseconds timeout);
  // Whether the last delta was pushed (it may not have been read yet).
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  // Called (on the loop's thread, outside the stream's lock) after each delta is pushed, so that
  // an event-driven reader (a gRPC reactor) needs no thread waiting in Next. Also called once now
  // if deltas are already waiting.
  void SetListener(std::function<void()> listener);

 private:
  friend class EngineLoop;
  void Push(RequestDelta d);

  const RequestId id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestDelta> deltas_;     // guarded by mu_
  bool done_ = false;                 // the last delta was pushed; guarded by mu_
  std::function<void()> listener_;    // guarded by mu_
};

// The engine's state as of the end of the last step.
struct EngineSnapshot {
  int32_t num_running = 0, num_waiting = 0;
  int32_t kv_blocks_used = 0, kv_blocks_total = 0;  // used: held by sequences (cached free blocks are free)
  int32_t kv_blocks_peak = 0;                       // the most used after any step so far
  int64_t num_preemptions = 0;
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in prompt tokens
  // How long the oldest admitted request without a first token has waited (0: none): a floor on
  // the queueing delay a new request would see.
  double oldest_queued_ms = 0;
  EngineStats stats;
};

// Called on the loop's thread (keep them short): a request's first token, with its time since
// Submit, and its end (any reason, just before its last delta is pushed; `arrival_ms` is the Submit
// time).
struct LoopHooks {
  std::function<void(double ttft_ms)> on_first_token;
  std::function<void(const RequestOutput&)> on_finished;
  std::function<void(RequestId)> on_refused;  // the engine refused it (AddRequest failed)
};

// The loop steps one engine or, for a while after a model reload, several: each request runs on
// the engine it was submitted to (its lane) until it ends, and a lane that is no longer current is
// let go (its last reference dropped, on the loop's thread) once it has nothing left to run.
class EngineLoop {
 public:
  // `engine` must outlive the loop; from here on only the loop's thread touches it.
  explicit EngineLoop(Engine* engine, LoopHooks hooks = {});
  // The same for an engine the loop shares (it is kept until the loop lets the lane go).
  explicit EngineLoop(std::shared_ptr<Engine> engine, LoopHooks hooks = {});
  // Stops the loop: requests still running end with FinishReason::kAborted.
  ~EngineLoop();
  // The same, for an owner that must keep the loop callable (Cancel) while its thread ends.
  void Stop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request for the next step. Refusals (a duplicate id, bad sampling parameters, token
  // ids outside the vocabulary) arrive as the stream's only delta, with `error` set.
  std::shared_ptr<RequestStream> Submit(Request r);
  // The same on engine `lane`, which becomes one of the loop's lanes until its requests end.
  std::shared_ptr<RequestStream> Submit(Request r, std::shared_ptr<Engine> lane);
  // Makes `next` the current engine between two steps (what Submit without a lane, the snapshot's
  // KV blocks and the engine's counters refer to; its OpenMP threads are the loop's from then on),
  // and waits for it at most `timeout`. Requests already submitted finish on their own lanes.
  absl::Status Switch(std::shared_ptr<Engine> next, std::chrono::milliseconds timeout);
  // Aborts a request before the next step: its KV blocks are free once that step's snapshot is
  // out, and its stream ends with FinishReason::kAborted. Unknown or finished ids are ignored.
  void Cancel(RequestId id);
  // Aborts every request admitted so far (the end of a drain that ran out of time).
  void CancelAll();
  // Empties the engine's local prefix cache (Engine::ResetPrefixCache) on the loop's thread before
  // its next step, and waits for it at most `timeout`. Returns the blocks forgotten; calls that
  // overlap share one reset. UNAVAILABLE when the loop has stopped, DEADLINE_EXCEEDED when the
  // step in progress outlasts `timeout` (the reset still runs after it).
  absl::StatusOr<int32_t> ResetPrefixCache(std::chrono::milliseconds timeout);
  EngineSnapshot Snapshot() const;
  // What admission control reads on every request, as of the end of the last step: lock-free, so
  // that a refusal never waits for the loop's thread.
  int32_t num_running() const { return num_running_.load(std::memory_order_relaxed); }
  double oldest_queued_ms() const { return oldest_queued_ms_.load(std::memory_order_relaxed); }

 private:
  void Run();
  // Asks the loop for work counted by `done` (ticket: its number) and waits, mu_ held through `lock`,
  // until the loop has done it, at most `timeout`; `what` names the work in errors.
  absl::Status AwaitLoop(std::unique_lock<std::mutex>& lock, const int64_t& done, int64_t ticket,
                         std::chrono::milliseconds timeout, const char* what);
  // Applies the resets asked so far (before a step's requests are added) and wakes their callers.
  void ApplyResets();
  // Pushes the step's deltas to their streams. Loop thread only.
  void PublishDeltas(std::vector<RequestDelta> deltas);
  // Loop thread only: the lanes' bookkeeping.
  void AddLane(const std::shared_ptr<Engine>& lane);
  bool AnyUnfinished() const;
  void PublishSnapshot(double oldest_queued_ms);
  void DropIdleLanes();

  const LoopHooks hooks_;
  std::atomic<int32_t> num_running_{0};
  std::atomic<double> oldest_queued_ms_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Add {
    Request request;
    std::shared_ptr<RequestStream> stream;
    double submit_ms;  // the lane's clock
    std::shared_ptr<Engine> lane;
  };
  std::shared_ptr<Engine> submit_lane_;                                  // guarded by mu_: Submit's default
  std::shared_ptr<Engine> switch_to_;                                    // guarded by mu_: asked, not yet adopted
  int64_t switches_asked_ = 0, switches_done_ = 0;                        // guarded by mu_
  std::vector<Add> adds_;                                                // guarded by mu_
  std::vector<RequestId> cancels_;                                       // guarded by mu_
  bool stop_ = false, cancel_all_ = false;                                // guarded by mu_
  // Prefix-cache resets: asked counts the calls, done the last one applied (the loop applies every
  // call asked by then at once, and reset_cv_ wakes their callers), blocks what it forgot.
  int64_t resets_asked_ = 0, resets_done_ = 0;                            // guarded by mu_
  int32_t reset_blocks_ = 0;                                             // guarded by mu_
  bool stopped_ = false;  // the thread has ended: no reset will run; guarded by mu_
  std::condition_variable reset_cv_;  // wakes the callers of ResetPrefixCache and Switch
  EngineSnapshot snapshot_;                                              // guarded by mu_

  // Loop thread only: the streams of admitted requests, and the lanes (the current one first).
  struct Active {
    std::shared_ptr<RequestStream> stream;
    double submit_ms = 0;
    bool first_token = false;  // one was sent
    Engine* lane = nullptr;
  };
  std::unordered_map<RequestId, Active> active_;
  std::vector<std::shared_ptr<Engine>> lanes_;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace specula

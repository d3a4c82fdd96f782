// Admission control for `specula serve` (and the serving simulator, which decides with the same
// code): refuse at once what would wait too long, rather than let an overloaded server get slow for
// everyone. Pure bookkeeping: times are given by the caller, in seconds of its own clock.
//
// - Queue length: requests submitted and not yet running, against --max-queue-len.
// - Queue delay: the wait a new request would see, predicted as the completions needed before a
//   slot frees divided by the completion rate of the last window, and at least how long the
//   oldest queued request has already waited; against --max-queue-delay-ms.
// - TTFT circuit breaker: while the P99 time to first token of the last window (10 s) is above
//   --ttft-slo-ms, requests below the highest priority (priority > 0; lower is more urgent) are
//   shed until it recovers.
// A decision is linear at worst in the window's samples and takes no engine lock.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

namespace specula {

struct AdmissionConfig {
  int32_t max_queue_len = 0;       // 0: no limit
  double max_queue_delay_ms = 0;   // 0: no limit
  double ttft_slo_ms = 0;          // 0: no circuit breaker
  double window_s = 10;            // TTFT and completion-rate window
  int32_t min_ttft_samples = 10;   // fewer in the window: the breaker stays closed
};

// What the server knows when a request arrives.
struct QueueState {
  int32_t queued = 0;       // submitted, not running yet
  int32_t free_slots = 0;   // max_num_seqs - running
  double oldest_queued_ms = 0;
};

class Admission {
 public:
  explicit Admission(AdmissionConfig config) : config_(config) {}

  // Empty: admit. Otherwise the reason ("queue_len", "queue_delay" or "ttft_slo") and, in
  // `detail`, the numbers behind it.
  std::string Check(int32_t priority, const QueueState& q, double now_s, std::string* detail);
  void ObserveTtft(double now_s, double ttft_ms);
  void ObserveCompletion(double now_s);

  // The predicted queueing delay of a new request (0 when a slot is free; -1 when there is no
  // completion rate yet to predict it from).
  double PredictDelayMs(const QueueState& q, double now_s);
  double P99TtftMs(double now_s);  // 0 without samples
  const AdmissionConfig& config() const { return config_; }

 private:
  void Expire(double now_s);  // drops samples older than the window; mu_ held

  const AdmissionConfig config_;
  std::mutex mu_;
  std::deque<std::pair<double, double>> ttft_;  // (time s, ttft ms), by time; guarded by mu_
  std::deque<double> completions_;               // completion times, s; guarded by mu_
};

}  // namespace specula

#include "scheduler/admission.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"

namespace specula {

void Admission::Expire(double now_s) {
  const double since = now_s - config_.window_s;
  while (!ttft_.empty() && ttft_.front().first < since) ttft_.pop_front();
  while (!completions_.empty() && completions_.front() < since) completions_.pop_front();
}

void Admission::ObserveTtft(double now_s, double ttft_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.emplace_back(now_s, ttft_ms);
  Expire(now_s);
}

void Admission::ObserveCompletion(double now_s) {
  std::lock_guard<std::mutex> lock(mu_);
  completions_.push_back(now_s);
  Expire(now_s);
}

double Admission::P99TtftMs(double now_s) {
  std::lock_guard<std::mutex> lock(mu_);
  Expire(now_s);
  if (ttft_.empty()) return 0;
  std::vector<double> v;
  v.reserve(ttft_.size());
  for (const auto& [t, ms] : ttft_) v.push_back(ms);
  // Nearest rank: the smallest sample with at least 99% of the samples at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(0.99 * v.size())) - 1;
  std::nth_element(v.begin(), v.begin() + rank, v.end());
  return v[rank];
}

double Admission::PredictDelayMs(const QueueState& q, double now_s) {
  if (q.queued < q.free_slots) return q.oldest_queued_ms;
  std::lock_guard<std::mutex> lock(mu_);
  Expire(now_s);
  if (completions_.size() < 2) return q.oldest_queued_ms > 0 ? q.oldest_queued_ms : -1;
  // The rate over the span the samples cover (a short burst of completions is not a full window).
  const double span = std::max(now_s - completions_.front(), 1e-3);
  const double rate = completions_.size() / span;  // completions per second
  const double needed = q.queued - q.free_slots + 1;
  return std::max(1e3 * needed / rate, q.oldest_queued_ms);
}

std::string Admission::Check(int32_t priority, const QueueState& q, double now_s, std::string* detail) {
  if (config_.max_queue_len > 0 && q.queued >= config_.max_queue_len) {
    *detail = absl::StrFormat("%d requests queued (--max-queue-len %d)", q.queued, config_.max_queue_len);
    return "queue_len";
  }
  if (config_.max_queue_delay_ms > 0) {
    const double delay = PredictDelayMs(q, now_s);
    if (delay > config_.max_queue_delay_ms) {
      *detail = absl::StrFormat("predicted queueing delay %.0f ms (--max-queue-delay-ms %.0f)", delay,
                                config_.max_queue_delay_ms);
      return "queue_delay";
    }
  }
  if (config_.ttft_slo_ms > 0 && priority > 0) {
    size_t samples;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Expire(now_s);
      samples = ttft_.size();
    }
    if (samples >= static_cast<size_t>(config_.min_ttft_samples)) {
      const double p99 = P99TtftMs(now_s);
      if (p99 > config_.ttft_slo_ms) {
        *detail = absl::StrFormat("P99 TTFT of the last %.0f s is %.0f ms (--ttft-slo-ms %.0f); priority %d is shed",
                                  config_.window_s, p99, config_.ttft_slo_ms, priority);
        return "ttft_slo";
      }
    }
  }
  return "";
}

}  // namespace specula

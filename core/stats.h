// Summary statistics of latencies, as `vllm bench serve` reports them: shared by the load
// generator's summary and the serving simulator's, so that a prediction and a measurement are
// reduced the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specula {

struct Stats {
  double mean = 0, median = 0, p90 = 0, p99 = 0;
  int64_t count = 0;
};
// The q-th percentile (0..100) of sorted values, linearly interpolated (numpy's default).
double Percentile(const std::vector<double>& sorted, double q);
Stats Summarize(std::vector<double> values);
// The middle value of a non-empty set (the upper of the two middle ones when the count is even):
// one of the values itself, robust to the odd outlier.
template <typename T>
T UpperMedian(std::vector<T> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

struct GoodputSlo {  // milliseconds; a request is good when it meets every one given
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  // TPOT is 0 for a one-token request: as vLLM, it meets any TPOT goal.
  bool Met(double ttft_ms_, double tpot_ms_, double e2el_ms_) const {
    return (!ttft_ms || ttft_ms_ <= *ttft_ms) && (!tpot_ms || tpot_ms_ <= *tpot_ms) && (!e2el_ms || e2el_ms_ <= *e2el_ms);
  }
};
// "ttft:500 tpot:50 e2el:2000" (space- or comma-separated KEY:MS; any subset, each key at most once).
absl::StatusOr<GoodputSlo> ParseGoodput(std::string_view spec);

}  // namespace specula

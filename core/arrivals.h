// When requests arrive: the load generator's send schedule (`bench-serve`, experiments) and the
// serving simulator's arrivals, one function so that a simulation replays a measured run exactly.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace specula {

struct ArrivalOptions {
  int32_t num_requests = 100;
  double request_rate = std::numeric_limits<double>::infinity();  // req/s; inf: every request at 0
  double burstiness = 1.0;       // gamma shape of the gaps: 1 = Poisson, < 1 burstier, > 1 steadier
  double burst_factor = 1.0;     // the rate is request_rate * burst_factor inside the burst window
  double burst_start_s = 0.0;    // the window is [burst_start_s, burst_start_s + burst_duration_s)
  double burst_duration_s = 0.0;
  uint64_t seed = 0;
};

// Send times in seconds from the start, non-decreasing. The gaps are gamma(shape B, mean 1/R)
// (vLLM's --burstiness), drawn in "operational time" and mapped through the integrated rate, so the
// burst window raises the rate by its factor while keeping the same burstiness. Same seed, same
// schedule. Expects validated options (rate > 0, burstiness > 0, factor > 0, durations >= 0).
std::vector<double> ArrivalTimes(const ArrivalOptions& opt);

}  // namespace specula

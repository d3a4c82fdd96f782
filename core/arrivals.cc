#include "core/arrivals.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace specula {

std::vector<double> ArrivalTimes(const ArrivalOptions& o) {
  std::vector<double> t(std::max(o.num_requests, 0), 0.0);
  if (std::isinf(o.request_rate)) return t;
  std::mt19937_64 rng(o.seed);
  // Gaps of mean 1 in operational time u = integral of the rate: u = R t before the window, grows
  // at R F inside it and at R after it. Mapping u back to t keeps the gaps' shape (burstiness).
  std::gamma_distribution<double> gap(o.burstiness, 1.0 / o.burstiness);
  const double r = o.request_rate, f = o.burst_factor, s = o.burst_start_s, d = o.burst_duration_s;
  const double u_start = r * s, u_end = u_start + r * f * d;
  double u = 0;
  for (double& x : t) {
    u += gap(rng);
    x = u < u_start ? u / r : u < u_end ? s + (u - u_start) / (r * f) : s + d + (u - u_end) / r;
  }
  return t;
}

}  // namespace specula

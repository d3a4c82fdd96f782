#include "sim/planner.h"

#include <algorithm>
#include <cmath>
#include <thread>

namespace specula {
namespace {

constexpr double kMaxBurst = 20;
constexpr double kMinRate = 1e-4;        // req/s per replica: below it a candidate is infeasible
constexpr double kMaxReplicas = 1e9;

struct Runner {
  const PlanCandidate& c;
  const PlanWorkload& w;
  const PlanSlo& slo;
  double simulated_seconds = 0;
  int64_t runs = 0;

  // One replica at `rate` req/s, with the workload's bursts at `burst` (0: the workload's own).
  SimSummary Run(double rate, double burst = 0) {
    SyntheticWorkload s = w.requests;
    s.arrivals.request_rate = rate;
    s.arrivals.num_requests =
        static_cast<int32_t>(std::clamp(rate * w.duration_s, double(w.min_requests), double(w.max_requests)));
    if (burst > 0) {
      s.arrivals.burst_factor = burst;
      if (s.arrivals.burst_duration_s <= 0) {  // the middle tenth of the run
        const double span = s.arrivals.num_requests / rate;
        s.arrivals.burst_start_s = 0.45 * span;
        s.arrivals.burst_duration_s = 0.1 * span;
      }
    }
    FleetConfig f;
    f.replica = c.replica;
    f.seed = w.requests.arrivals.seed;
    const std::unique_ptr<AcceptanceModel> acceptance = c.acceptance->Fresh();
    const SimSummary out = Simulate(f, MakeRequests(s), acceptance.get(), slo.per_request).fleet;
    simulated_seconds += out.duration_s;
    ++runs;
    return out;
  }

  // The highest rate that meets the SLOs: up by 1.5x from a rate that surely does, then bisection
  // to 1% between the last that met them and the first that did not.
  double Capacity(std::vector<LoadPoint>* curve) {
    auto probe = [&](double rate) {
      LoadPoint p{rate, Run(rate), false};
      p.meets = MeetsSlo(p.summary, slo);
      curve->push_back(p);
      return p.meets;
    };
    double lo = 0, hi = 0, rate = 0.05;
    while (rate >= kMinRate && !probe(rate)) {  // down to a rate that meets them, if any does
      hi = rate;
      rate /= 4;
    }
    if (rate < kMinRate) return 0;  // not even one request at a time meets the SLOs
    lo = rate;
    while (hi == 0 && (rate *= 1.5) < 1e6) (probe(rate) ? lo : hi) = rate;
    while (hi > 0 && hi - lo > 0.01 * hi) {
      const double mid = std::sqrt(std::max(lo, hi / 1.5) * hi);
      (probe(mid) ? lo : hi) = mid;
    }
    std::sort(curve->begin(), curve->end(), [](const LoadPoint& a, const LoadPoint& b) { return a.rate < b.rate; });
    return lo;
  }

  // The largest burst factor (to kMaxBurst) under which one replica at `rate` meets the SLOs.
  double BurstSustained(double rate) {
    if (!MeetsSlo(Run(rate, 1.0001), slo)) return 0;
    double lo = 1, hi = kMaxBurst;
    if (MeetsSlo(Run(rate, hi), slo)) return hi;
    while (hi - lo > 0.05 * lo) {
      const double mid = std::sqrt(lo * hi);
      (MeetsSlo(Run(rate, mid), slo) ? lo : hi) = mid;
    }
    return lo;
  }
};

CandidatePlan PlanOne(const PlanCandidate& c, const PlanWorkload& w, const PlanSlo& slo, const std::vector<double>& qps,
                      double* simulated_seconds, int64_t* runs) {
  Runner r{c, w, slo};
  CandidatePlan p;
  p.name = c.name;
  p.source = c.source;
  p.price_per_hour = c.price_per_hour;
  p.capacity = r.Capacity(&p.curve);
  for (double q : qps) {
    CandidatePlan::AtQps a;
    a.qps = q;
    if (p.capacity > 0 && q / p.capacity <= kMaxReplicas) {
      // The share of the capacity's replica count is simulated too; near the knee one run can miss
      // where the search's run met the SLOs, and then a few more replicas are added until it meets.
      a.replicas = static_cast<int64_t>(std::ceil(q / p.capacity - 1e-9));
      a.at_share = r.Run(q / a.replicas);
      for (int tries = 0; tries < 10 && !MeetsSlo(a.at_share, slo); ++tries) {
        a.replicas += std::max<int64_t>(1, a.replicas / 100);
        a.at_share = r.Run(q / a.replicas);
      }
      const double tokens_per_s = q * (a.at_share.completed > 0 ? a.at_share.output_tok_s / a.at_share.request_throughput : 0);
      a.cost_per_mtok = tokens_per_s > 0 ? a.replicas * c.price_per_hour / 3600 / tokens_per_s * 1e6 : 0;
      a.headroom = a.replicas * p.capacity / q - 1;
      a.burst_sustained = r.BurstSustained(q / a.replicas);
    }
    p.at.push_back(a);
  }
  *simulated_seconds = r.simulated_seconds;
  *runs = r.runs;
  return p;
}

}  // namespace

bool MeetsSlo(const SimSummary& s, const PlanSlo& slo) {
  if (s.requests == 0 || s.completed == 0) return false;
  if (slo.ttft_p99_ms > 0 && s.ttft_ms.p99 > slo.ttft_p99_ms) return false;
  if (slo.tpot_p99_ms > 0 && s.tpot_ms.p99 > slo.tpot_p99_ms) return false;
  return s.goodput >= slo.goodput;
}

Plan MakePlan(const std::vector<PlanCandidate>& candidates, const PlanWorkload& workload, const PlanSlo& slo,
              const std::vector<double>& qps) {
  Plan plan;
  plan.qps = qps;
  plan.candidates.resize(candidates.size());
  std::vector<double> seconds(candidates.size(), 0);
  std::vector<int64_t> runs(candidates.size(), 0);
  // Candidates are independent: one thread each, up to the machine's cores.
  const size_t width = std::max(1u, std::thread::hardware_concurrency());
  for (size_t start = 0; start < candidates.size(); start += width) {
    std::vector<std::thread> threads;
    for (size_t i = start; i < std::min(candidates.size(), start + width); ++i) {
      threads.emplace_back([&, i] { plan.candidates[i] = PlanOne(candidates[i], workload, slo, qps, &seconds[i], &runs[i]); });
    }
    for (std::thread& t : threads) t.join();
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    plan.simulated_seconds += seconds[i];
    plan.runs += runs[i];
  }
  for (size_t q = 0; q < qps.size(); ++q) {
    int best = -1;
    for (size_t i = 0; i < plan.candidates.size(); ++i) {
      const auto& a = plan.candidates[i].at[q];
      if (a.replicas > 0 && (best < 0 || a.cost_per_mtok < plan.candidates[best].at[q].cost_per_mtok)) best = static_cast<int>(i);
    }
    plan.cheapest.push_back(best);
  }
  return plan;
}

}  // namespace specula

// The capacity planner behind `specula plan`: for each candidate replica configuration, the
// highest per-replica arrival rate at which the simulated replica still meets the SLOs under the
// workload (its bursts included), then the replicas a target load needs, their cost per million
// output tokens, and the burst the fleet absorbs. The router is taken to split load evenly, so one
// replica is simulated at its share of the load (said in every plan, with the simulated duration).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/fleet.h"

namespace specula {

struct PlanCandidate {
  std::string name;
  ReplicaConfig replica;
  std::shared_ptr<AcceptanceModel> acceptance;
  double price_per_hour = 0;  // one replica, any currency
  std::string source;         // where its step times come from (origin and description)
};

struct PlanSlo {
  double ttft_p99_ms = 0, tpot_p99_ms = 0;  // 0: no bound
  double goodput = 0.99;                    // the share of requests within `per_request`
  GoodputSlo per_request;                   // what a good request meets (defaults to the P99 bounds)
};

struct PlanWorkload {
  SyntheticWorkload requests;  // arrivals.request_rate is set by the planner; bursts are kept
  double duration_s = 60;      // simulated per run (requests = rate x duration, within the bounds below)
  int32_t min_requests = 200, max_requests = 20000;
};

struct LoadPoint {
  double rate = 0;  // per replica, req/s
  SimSummary summary;
  bool meets = false;
};

struct CandidatePlan {
  std::string name, source;
  double price_per_hour = 0;
  double capacity = 0;            // the highest rate per replica that meets the SLOs (0: none does)
  std::vector<LoadPoint> curve;   // every rate simulated, by rate
  struct AtQps {
    double qps = 0;
    int64_t replicas = 0;          // 0: infeasible
    double cost_per_mtok = 0;      // price per million output tokens
    double headroom = 0;           // replicas x capacity / qps - 1
    double burst_sustained = 0;    // the largest burst factor the fleet meets the SLOs under (<= 20)
    SimSummary at_share;           // one replica at qps / replicas
  };
  std::vector<AtQps> at;           // per target qps
};

struct Plan {
  std::vector<CandidatePlan> candidates;
  std::vector<double> qps;
  std::vector<int> cheapest;       // per qps: the candidate index, -1 if none is feasible
  double simulated_seconds = 0;    // simulated time over every run, for the note
  int64_t runs = 0;
};

// Whether a simulated run meets the SLOs.
bool MeetsSlo(const SimSummary& s, const PlanSlo& slo);

// The plan for each target load in `qps` (increasing). The burst a fleet sustains is searched in a
// window of the workload's own if it has one, else in the middle tenth of the simulated duration.
Plan MakePlan(const std::vector<PlanCandidate>& candidates, const PlanWorkload& workload, const PlanSlo& slo,
              const std::vector<double>& qps);

}  // namespace specula

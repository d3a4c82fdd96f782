// The flags `specula simulate` and `specula plan` share: where step times come from, the replica's
// scheduler, admission and speculation, the acceptance of drafts, and the workload.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "core/flags.h"
#include "core/stats.h"
#include "sim/fleet.h"

namespace specula {

extern const std::set<std::string> kSimFlags;
extern const std::set<std::string> kSimSwitches;
extern const char kSimFlagsHelp[];

struct SimSetup {
  ReplicaConfig replica;
  std::unique_ptr<AcceptanceModel> acceptance;
  SyntheticWorkload workload;
  std::optional<std::string> trace;  // --trace: arrivals and lengths from a file instead
  bool acceptance_from_trace = false;  // --acceptance trace: the trace's n-gram draft profiles
  int32_t replicas = 1;
  Routing routing = Routing::kLeastOutstanding;
  GoodputSlo slo;
  uint64_t seed = 0;
  std::string device = "cpu";      // what a replica is (--device), for the plan's prices
  std::string cost_source;         // one line: where the step times come from, and their origin
  std::string spec_label = "none"; // "none", "ngram k=4", "draft auto", ...
};

// Errors name the flag: a value that does not parse or is out of range, a cost source missing or
// given twice, speculation without an acceptance, a draft model without its step times.
absl::StatusOr<SimSetup> SimSetupFromFlags(const Flags& flags);

// The requests of the setup's workload (its trace, or the synthetic one).
absl::StatusOr<std::vector<SimRequest>> SimRequests(const SimSetup& s);

}  // namespace specula

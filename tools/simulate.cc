#include "tools/simulate.h"

#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "absl/strings/str_join.h"
#include "tools/sim_flags.h"

namespace specula {
namespace {

using json = nlohmann::json;

constexpr char kUsage[] = R"(usage: specula simulate (--cost FILE | --device NAME --shape NAME) [flags]
       specula simulate --validate RESULTS_DIR --cost FILE [--json] [--steps-out DIR]

A discrete-event simulation of serving replicas: each runs Specula's own scheduler (paged KV with
prefix caching, chunked prefill, preemption), admission control and adaptive speculation, with
every forward's time taken from a step-time model instead of running it. Reports what bench-serve
reports (TTFT, TPOT, ITL, E2E percentiles, throughput, goodput, refusals, KV use, preemptions), for
the fleet and with --per-replica for each replica. Same flags and seed, same output, byte for byte.

  --json              one JSON object on stdout instead of the table
  --per-replica       a table (or JSON entry) per replica too
  --validate DIR      replay an ONLINE experiment's results (DIR/run.json, DIR/results.jsonl): its
                      arrivals, lengths (its traces/ if recorded) and configurations, with the
                      acceptance each point measured (an n-gram point's trace: each request's
                      drafts, replayed step by step), and compare the prediction with each point's
                      measurement; --json prints {"points": [{"params", "measured", "predicted",
                      "step_times"}]} (step_times: the model over the runs' own recorded steps)
  --steps-out DIR     with --validate: each point's simulated steps and requests,
                      DIR/point-N.steps.jsonl and DIR/point-N.jsonl, in the format of the runs'
                      traces/*.steps.jsonl and traces/*.jsonl
  With --validate, --acceptance-spread C varies each speculative point's measured acceptance per
  request, and --propose-us N sets an n-gram or suffix proposer's host time per drafting sequence
  (default: none).

)";

json StatsJson(const Stats& s) { return {{"mean", s.mean}, {"p50", s.median}, {"p90", s.p90}, {"p99", s.p99}}; }

void PrintTable(const SimSummary& s) {
  std::printf("%s\n", std::string(50, '=').c_str());
  std::printf("%-40s %d\n", "Requests", s.requests);
  std::printf("%-40s %d / %d\n", "Completed / refused", s.completed, s.refused);
  for (const auto& [reason, n] : s.refusals) std::printf("  %-38s %d\n", absl::StrCat("refused: ", reason).c_str(), n);
  std::printf("%-40s %.2f\n", "Simulated duration (s)", s.duration_s);
  std::printf("%-40s %.2f\n", "Request throughput (req/s)", s.request_throughput);
  std::printf("%-40s %.2f\n", "Output token throughput (tok/s)", s.output_tok_s);
  std::printf("%-40s %.4f (%.2f req/s)\n", "Goodput (share in SLO)", s.goodput, s.request_goodput);
  for (const auto& [name, st] : {std::pair<const char*, const Stats*>{"TTFT", &s.ttft_ms}, {"TPOT", &s.tpot_ms},
                                 {"ITL", &s.itl_ms}, {"E2E", &s.e2e_ms}}) {
    std::printf("%-40s %.2f / %.2f / %.2f / %.2f\n", absl::StrCat(name, " mean / P50 / P90 / P99 (ms)").c_str(), st->mean,
                st->median, st->p90, st->p99);
  }
  std::printf("%-40s %.3f / %.3f\n", "KV use, mean / peak", s.kv_usage_mean, s.kv_usage_peak);
  std::printf("%-40s %lld\n", "Preemptions", static_cast<long long>(s.preemptions));
  std::printf("%-40s %lld (mean k %.2f)\n", "Steps", static_cast<long long>(s.steps), s.mean_k);
  if (s.draft_tokens > 0) {
    std::printf("%-40s %lld of %lld\n", "Drafts accepted", static_cast<long long>(s.accepted_tokens),
                static_cast<long long>(s.draft_tokens));
  }
  std::printf("%s\n", std::string(50, '=').c_str());
}

absl::Status Simulate(const Flags& flags) {
  ASSIGN_OR_RETURN(SimSetup setup, SimSetupFromFlags(flags));
  ASSIGN_OR_RETURN(std::vector<SimRequest> requests, SimRequests(setup));
  if (setup.acceptance_from_trace) setup.acceptance = WithDraftProfiles(requests, std::move(setup.acceptance));
  FleetConfig fc;
  fc.replicas = setup.replicas;
  fc.routing = setup.routing;
  fc.replica = setup.replica;
  fc.seed = setup.seed;
  const FleetResult r = specula::Simulate(fc, requests, setup.acceptance.get(), setup.slo);
  const bool per_replica = flags.switches.count("per-replica") > 0;
  if (flags.switches.count("json")) {
    json j = {{"cost", {{"origin", CostOriginName(setup.replica.target.origin())},
                        {"description", setup.replica.target.description()}}},
              {"replicas", setup.replicas},
              {"routing", RoutingName(setup.routing)},
              {"speculation", setup.spec_label},
              {"fleet", SimSummaryJson(r.fleet)}};
    if (per_replica) {
      for (const SimSummary& s : r.per_replica) j["per_replica"].push_back(SimSummaryJson(s));
    }
    std::cout << j.dump(1) << "\n";
    return absl::OkStatus();
  }
  std::printf("[simulate] %s\n", setup.cost_source.c_str());
  std::printf("[simulate] %d replica(s), routing %s, speculation %s, %zu requests, %.1f s simulated\n", setup.replicas,
              RoutingName(setup.routing), setup.spec_label.c_str(), requests.size(), r.fleet.duration_s);
  PrintTable(r.fleet);
  if (per_replica) {
    for (size_t i = 0; i < r.per_replica.size(); ++i) {
      std::printf("replica %zu\n", i);
      PrintTable(r.per_replica[i]);
    }
  }
  return absl::OkStatus();
}

}  // namespace

json SimSummaryJson(const SimSummary& s) {
  json refusals = json::object();
  for (const auto& [reason, n] : s.refusals) refusals[reason] = n;
  return {{"requests", s.requests}, {"completed", s.completed}, {"refused", s.refused}, {"refusals", refusals},
          {"duration_s", s.duration_s}, {"request_throughput", s.request_throughput}, {"output_tok_s", s.output_tok_s},
          {"goodput", s.goodput}, {"request_goodput", s.request_goodput}, {"ttft_ms", StatsJson(s.ttft_ms)},
          {"tpot_ms", StatsJson(s.tpot_ms)}, {"itl_ms", StatsJson(s.itl_ms)}, {"e2e_ms", StatsJson(s.e2e_ms)},
          {"ttft_p50_ms", s.ttft_ms.median}, {"ttft_p99_ms", s.ttft_ms.p99}, {"tpot_p50_ms", s.tpot_ms.median},
          {"tpot_p99_ms", s.tpot_ms.p99}, {"kv_usage_mean", s.kv_usage_mean}, {"kv_usage_peak", s.kv_usage_peak},
          {"preemptions", s.preemptions}, {"steps", s.steps}, {"mean_k", s.mean_k},
          {"draft_tokens", s.draft_tokens}, {"accepted_tokens", s.accepted_tokens}};
}

absl::Status RunSimulate(int argc, char** argv) {
  std::set<std::string> known = kSimFlags, switches = kSimSwitches;
  known.insert({"validate", "steps-out"});
  switches.insert({"json", "per-replica", "help"});
  ASSIGN_OR_RETURN(Flags flags, ParseFlags(argc, argv, known, switches));
  if (flags.switches.count("help")) {
    std::cout << kUsage << kSimFlagsHelp;
    return absl::OkStatus();
  }
  if (flags.values.count("validate")) return RunValidate(flags);
  return Simulate(flags);
}

}  // namespace specula

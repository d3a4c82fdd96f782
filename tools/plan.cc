// `specula plan`: the cheapest fleet of candidate replica configurations that meets the SLOs at a
// target load (sim/planner.h), with a report and plots.
#include "tools/plan.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"
#include "sim/planner.h"
#include "tools/sim_flags.h"
#include "tools/simulate.h"

#ifndef SPECULA_SOURCE_DIR
#define SPECULA_SOURCE_DIR "."
#endif

namespace specula {
namespace {

using json = nlohmann::json;

constexpr char kUsage[] = R"(usage: specula plan --qps LIST [--candidates FILE | simulate's replica flags --price-per-hour P]
                    [--slo-ttft-p99-ms MS] [--slo-tpot-p99-ms MS] [--slo-goodput X] [workload flags]
                    [--out DIR] [--json]

For each candidate replica configuration, the highest arrival rate one replica sustains within the
SLOs (the workload's bursts included), then, for each target load, the replicas it takes, their
cost per million output tokens, the spare capacity, and the largest burst (up to 20x) the fleet
absorbs; the cheapest feasible candidate is marked. The router is taken to split load evenly, so
one replica is simulated at its share: the plan says so, with the simulated time it took.

  --qps LIST            target loads in requests/s, e.g. 2000 or 100,1000,10000
  --candidates FILE     JSON: [{"name": "h100-8b", "price_per_hour": 4.0,
                                "flags": "--device h100 --shape llama-3.1-8b --max-num-seqs 128"}, ...]
                        each "flags" is simulate's replica and speculation flags, split on spaces
  --price-per-hour P    one replica's price, when the replica is given by flags here (default 1)
  --slo-ttft-p99-ms MS  --slo-tpot-p99-ms MS   P99 bounds (default 500 and 0: none)
  --slo-goodput X       the share of requests that must meet both bounds (default 0.99)
  --sim-duration-s S    simulated seconds per run (default 60; 200 to 20,000 requests)
  --out DIR             DIR/plan.json, DIR/plan.md and plots (python3 with matplotlib)
  --json                the plan as one JSON object on stdout

)";

struct PlanArgs {
  std::vector<double> qps;
  PlanSlo slo;
  PlanWorkload workload;
  std::vector<PlanCandidate> candidates;
  std::string out;
};

absl::StatusOr<std::vector<double>> QpsList(const std::string& text) {
  std::vector<double> out;
  for (absl::string_view v : absl::StrSplit(text, ',')) {
    double q;
    if (!absl::SimpleAtod(v, &q) || !(q > 0) || !std::isfinite(q)) {
      return absl::InvalidArgumentError(absl::StrCat("--qps: '", std::string(v), "' is not a number > 0"));
    }
    out.push_back(q);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A candidate from simulate's flags: the command line's workload flags with the candidate's own.
absl::StatusOr<PlanCandidate> Candidate(const Flags& base, const std::string& name, const std::string& flags, double price,
                                        SyntheticWorkload* workload) {
  Flags f = base;
  if (!flags.empty()) {
    std::vector<std::string> words = absl::StrSplit(flags, ' ', absl::SkipEmpty());
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    auto own = ParseFlags(static_cast<int>(argv.size()), argv.data(), kSimFlags, kSimSwitches);
    if (!own.ok()) return absl::InvalidArgumentError(absl::StrCat("candidate '", name, "': ", own.status().message()));
    for (const auto& [k, v] : own->values) f.values[k] = v;
    f.switches.insert(own->switches.begin(), own->switches.end());
  }
  auto setup = SimSetupFromFlags(f);
  if (!setup.ok()) return absl::InvalidArgumentError(absl::StrCat("candidate '", name, "': ", setup.status().message()));
  PlanCandidate c;
  c.name = name;
  c.replica = setup->replica;
  c.acceptance = std::move(setup->acceptance);
  c.price_per_hour = price;
  c.source = setup->cost_source;
  *workload = setup->workload;  // the same for every candidate: the command line's
  return c;
}

absl::Status Candidates(const Flags& flags, const Flags& base, PlanArgs* a) {
  if (!flags.values.count("candidates")) {
    double price = 1;
    RETURN_IF_ERROR(GetNumber(flags, "price-per-hour", &price));
    ASSIGN_OR_RETURN(PlanCandidate c, Candidate(base, "replica", "", price, &a->workload.requests));
    a->candidates.push_back(std::move(c));
    return absl::OkStatus();
  }
  const std::string path = flags.values.at("candidates");
  std::ifstream in(path);
  const json j = in ? json::parse(in, nullptr, false) : json();
  if (!j.is_array() || j.empty()) return absl::InvalidArgumentError(absl::StrCat("--candidates: ", path, ": not a non-empty JSON array"));
  for (size_t i = 0; i < j.size(); ++i) {
    const json& c = j[i];
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string() || !c.contains("flags") || !c["flags"].is_string() ||
        !c.contains("price_per_hour") || !c["price_per_hour"].is_number() || c["price_per_hour"].get<double>() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--candidates: ", path, "[", i,
                                                     "] needs \"name\", \"flags\" (a string) and \"price_per_hour\" > 0"));
    }
    ASSIGN_OR_RETURN(PlanCandidate pc,
                     Candidate(base, c["name"], c["flags"], c["price_per_hour"].get<double>(), &a->workload.requests));
    a->candidates.push_back(std::move(pc));
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanArgs> Parse(const Flags& flags) {
  PlanArgs a;
  if (!flags.values.count("qps")) return absl::InvalidArgumentError("plan needs --qps LIST");
  ASSIGN_OR_RETURN(a.qps, QpsList(flags.values.at("qps")));
  a.slo.ttft_p99_ms = 500;
  for (auto [name, v] : {std::pair<const char*, double*>{"slo-ttft-p99-ms", &a.slo.ttft_p99_ms},
                         {"slo-tpot-p99-ms", &a.slo.tpot_p99_ms}, {"slo-goodput", &a.slo.goodput},
                         {"sim-duration-s", &a.workload.duration_s}}) {
    RETURN_IF_ERROR(GetNumber(flags, name, v));
    if (*v < 0 || !std::isfinite(*v)) return absl::InvalidArgumentError(absl::StrCat("--", name, ": must be >= 0"));
  }
  if (a.slo.goodput > 1) return absl::InvalidArgumentError("--slo-goodput: a share in [0, 1]");
  if (a.slo.ttft_p99_ms > 0) a.slo.per_request.ttft_ms = a.slo.ttft_p99_ms;
  if (a.slo.tpot_p99_ms > 0) a.slo.per_request.tpot_ms = a.slo.tpot_p99_ms;
  // The workload's flags go to every candidate; simulate's defaults stand for what is not given.
  Flags base;
  for (const auto& [k, v] : flags.values) {
    if (kSimFlags.count(k)) base.values[k] = v;
  }
  base.switches = flags.switches;
  RETURN_IF_ERROR(Candidates(flags, base, &a));
  if (flags.values.count("out")) a.out = flags.values.at("out");
  return a;
}

json StatsJson(const Stats& s) { return {{"p50", s.median}, {"p90", s.p90}, {"p99", s.p99}}; }

json PlanJson(const Plan& plan, const PlanArgs& a) {
  json j = {{"qps", plan.qps}, {"slo", {{"ttft_p99_ms", a.slo.ttft_p99_ms}, {"tpot_p99_ms", a.slo.tpot_p99_ms},
                                        {"goodput", a.slo.goodput}}},
            {"note", absl::StrCat("the router is taken to split load evenly: one replica simulated at its share; ",
                                  plan.runs, " runs, ", static_cast<int64_t>(plan.simulated_seconds), " s simulated")},
            {"workload", {{"input_len", a.workload.requests.prompt_len}, {"output_len", a.workload.requests.output_len},
                          {"burstiness", a.workload.requests.arrivals.burstiness},
                          {"burst_factor", a.workload.requests.arrivals.burst_factor}}},
            {"cheapest", plan.cheapest}, {"candidates", json::array()}};
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const CandidatePlan& c = plan.candidates[i];
    json cj = {{"name", c.name}, {"source", c.source}, {"price_per_hour", c.price_per_hour},
               {"capacity_rps", c.capacity}, {"curve", json::array()}, {"at", json::array()}};
    for (const LoadPoint& p : c.curve) {
      cj["curve"].push_back({{"rate", p.rate}, {"meets", p.meets}, {"ttft_ms", StatsJson(p.summary.ttft_ms)},
                             {"tpot_ms", StatsJson(p.summary.tpot_ms)}, {"goodput", p.summary.goodput},
                             {"output_tok_s", p.summary.output_tok_s}});
    }
    for (const CandidatePlan::AtQps& q : c.at) {
      cj["at"].push_back({{"qps", q.qps}, {"replicas", q.replicas}, {"cost_per_mtok", q.cost_per_mtok},
                          {"headroom", q.headroom}, {"burst_sustained", q.burst_sustained},
                          {"ttft_p99_ms", q.at_share.ttft_ms.p99}, {"tpot_p99_ms", q.at_share.tpot_ms.p99}});
    }
    j["candidates"].push_back(cj);
  }
  return j;
}

void PrintPlan(const Plan& plan, const json& j) {
  std::printf("[plan] %s\n", j["note"].get<std::string>().c_str());
  for (const CandidatePlan& c : plan.candidates) {
    std::printf("[plan] %s: %.3g req/s per replica within the SLOs; %s\n", c.name.c_str(), c.capacity, c.source.c_str());
  }
  for (size_t q = 0; q < plan.qps.size(); ++q) {
    std::printf("\nat %g req/s:\n  %-20s %10s %14s %10s %10s %14s\n", plan.qps[q], "candidate", "replicas", "cost/Mtok out",
                "headroom", "burst", "P99 TTFT (ms)");
    for (size_t i = 0; i < plan.candidates.size(); ++i) {
      const auto& a = plan.candidates[i].at[q];
      if (a.replicas == 0) {
        std::printf("  %-20s %10s\n", plan.candidates[i].name.c_str(), "none meets the SLOs");
        continue;
      }
      std::printf("  %-20s %10lld %14.4f %9.0f%% %9.1fx %14.1f%s\n", plan.candidates[i].name.c_str(),
                  static_cast<long long>(a.replicas), a.cost_per_mtok, 100 * a.headroom, a.burst_sustained,
                  a.at_share.ttft_ms.p99, plan.cheapest[q] == static_cast<int>(i) ? "   <- cheapest" : "");
    }
  }
}

// DIR/plan.json, then experiments/plan_report.py for plan.md and the plots.
absl::Status WriteReport(const json& j, const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  {
    std::ofstream f(dir + "/plan.json");
    f << j.dump(1) << "\n";
    if (!f) return absl::PermissionDeniedError(absl::StrCat("--out: cannot write ", dir, "/plan.json"));
  }
  const char* env = std::getenv("SPECULA_PLAN_REPORT_SCRIPT");
  const std::string script = env ? env : absl::StrCat(SPECULA_SOURCE_DIR, "/experiments/plan_report.py");
  const std::string cmd = absl::StrCat("python3 '", script, "' '", dir, "/plan.json'");
  if (std::system(cmd.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("the report failed: ", cmd, " (python3 with matplotlib: scripts/install_deps.sh)"));
  }
  std::fprintf(stderr, "[plan] report: %s/plan.md\n", dir.c_str());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunPlan(int argc, char** argv) {
  std::set<std::string> known = kSimFlags, switches = kSimSwitches;
  known.insert({"qps", "candidates", "price-per-hour", "slo-ttft-p99-ms", "slo-tpot-p99-ms", "slo-goodput",
                "sim-duration-s", "out"});
  switches.insert({"json", "help"});
  ASSIGN_OR_RETURN(Flags flags, ParseFlags(argc, argv, known, switches));
  if (flags.switches.count("help")) {
    std::cout << kUsage << kSimFlagsHelp;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(PlanArgs a, Parse(flags));
  const auto t0 = std::chrono::steady_clock::now();
  const Plan plan = MakePlan(a.candidates, a.workload, a.slo, a.qps);
  json j = PlanJson(plan, a);
  j["planning_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (flags.switches.count("json")) {
    std::cout << j.dump(1) << "\n";
  } else {
    PrintPlan(plan, j);
    std::printf("\n[plan] planned in %.1f s\n", j["planning_seconds"].get<double>());
  }
  if (!a.out.empty()) return WriteReport(j, a.out);
  return absl::OkStatus();
}

}  // namespace specula

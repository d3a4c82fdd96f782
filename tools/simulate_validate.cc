// `specula simulate --validate DIR`: an ONLINE experiment's own workload replayed through the
// simulator, point by point, beside what each point measured.
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "tools/sim_flags.h"
#include "tools/simulate.h"

namespace specula {
namespace {

using json = nlohmann::json;

// The metrics compared: a measured run's JSON path and the simulator's flat key.
const std::vector<std::pair<std::vector<const char*>, const char*>>& Metrics() {
  static const std::vector<std::pair<std::vector<const char*>, const char*>> m = {
      {{"ttft_ms", "p50"}, "ttft_p50_ms"}, {{"ttft_ms", "p99"}, "ttft_p99_ms"}, {{"tpot_ms", "p50"}, "tpot_p50_ms"},
      {{"tpot_ms", "p99"}, "tpot_p99_ms"}, {{"output_tok_s"}, "output_tok_s"},   {{"goodput"}, "goodput"},
      {{"rejected"}, "refused"},         {{"spec", "draft_tokens"}, "draft_tokens"},
      {{"spec", "accepted_tokens"}, "accepted_tokens"}};
  return m;
}

absl::StatusOr<json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  return j;
}

// results.jsonl's lines grouped by point key, in the order the keys first appear.
absl::StatusOr<std::vector<std::vector<json>>> ReadPoints(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<std::vector<json>> points;
  std::map<std::string, size_t> index;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("key") || !j.contains("point")) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": not a results line"));
    }
    auto [it, added] = index.emplace(j["key"].get<std::string>(), points.size());
    if (added) points.emplace_back();
    points[it->second].push_back(std::move(j));
  }
  if (points.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no results"));
  return points;
}

double At(const json& j, const std::vector<const char*>& path) {
  const json* p = &j;
  for (const char* k : path) {
    if (!p->is_object() || !p->contains(k)) return NAN;
    p = &(*p)[k];
  }
  return p->is_number() ? p->get<double>() : NAN;
}

// The mean over the repeats, and their range.
json Measured(const std::vector<json>& runs) {
  json m, lo, hi;
  for (const auto& [path, key] : Metrics()) {
    double sum = 0, mn = INFINITY, mx = -INFINITY;
    int n = 0;
    for (const json& r : runs) {
      const double v = At(r, path);
      if (std::isnan(v)) continue;
      sum += v;
      mn = std::min(mn, v);
      mx = std::max(mx, v);
      ++n;
    }
    m[key] = n ? json(sum / n) : json();
    lo[key] = n ? json(mn) : json();
    hi[key] = n ? json(mx) : json();
  }
  m["repeats"] = runs.size();
  m["min"] = lo;
  m["max"] = hi;
  return m;
}

// Each draft's acceptance given the drafts before it were accepted, over the repeats: accepted over
// reached, per position, up to the last with at least kMinReached verifications (the model repeats
// the last). Empty where the runs did not record reached_per_position.
std::vector<double> MeasuredConditionalAcceptance(const std::vector<json>& runs) {
  constexpr double kMinReached = 10;
  std::vector<double> accepted, reached;  // [positions], summed over the runs
  for (const json& r : runs) {
    const json* s = r.contains("spec") && r["spec"].is_object() ? &r["spec"] : nullptr;
    if (s == nullptr || !s->contains("reached_per_position") || !s->contains("accepted_per_position")) return {};
    const json &a = (*s)["accepted_per_position"], &n = (*s)["reached_per_position"];
    accepted.resize(std::max(accepted.size(), a.size()), 0.0);
    reached.resize(std::max(reached.size(), n.size()), 0.0);
    for (size_t i = 0; i < a.size(); ++i) accepted[i] += a[i].get<double>();
    for (size_t i = 0; i < n.size(); ++i) reached[i] += n[i].get<double>();
  }
  std::vector<double> conditional;
  for (size_t i = 0; i < reached.size() && i < accepted.size() && reached[i] >= kMinReached; ++i) {
    conditional.push_back(std::min(1.0, accepted[i] / reached[i]));
  }
  return conditional;
}

// The acceptance per position averaged over the repeats (the point's own measurement).
std::vector<double> MeasuredAcceptance(const std::vector<json>& runs) {
  std::vector<double> sum;
  int n = 0;
  for (const json& r : runs) {
    if (!r.contains("spec") || !r["spec"].is_object() || !r["spec"].contains("acceptance_per_position")) continue;
    const json& p = r["spec"]["acceptance_per_position"];
    sum.resize(std::max(sum.size(), p.size()), 0.0);
    for (size_t i = 0; i < p.size(); ++i) sum[i] += p[i].get<double>();
    ++n;
  }
  for (double& v : sum) v /= std::max(n, 1);
  return sum;
}

// How often a proposer without a model found drafts when the controller asked for some: the
// verifications that carried drafts over the sequence-steps given k > 0 (the runs' k histogram).
double ProposalRate(const std::vector<json>& runs) {
  double verified = 0, asked = 0;
  for (const json& r : runs) {
    if (!r.contains("k_histogram") || !r["k_histogram"].is_array() || !r["spec"].is_object()) continue;
    for (size_t k = 1; k < r["k_histogram"].size(); ++k) asked += r["k_histogram"][k].get<double>();
    verified += r["spec"].value("drafts", 0.0);
  }
  return asked > 0 ? std::min(1.0, verified / asked) : 1.0;
}

// What the flags set for every speculative point (the rest comes from each point's results).
struct SpecFlags {
  bool acceptance_given = false;  // --acceptance: a fixed acceptance instead of each point's own
  double spread = 0;              // --acceptance-spread: per-request variation of the measured one
  double propose_s = -1;          // --propose-us: a proposer without a model's host time per sequence (-1: not given)
};

absl::StatusOr<SpecFlags> ReadSpecFlags(const Flags& flags) {
  SpecFlags f;
  f.acceptance_given = flags.values.count("acceptance") > 0;
  for (auto [name, out, scale] : {std::tuple<const char*, double*, double>{"acceptance-spread", &f.spread, 1},
                                  {"propose-us", &f.propose_s, 1e-6}}) {
    if (!flags.values.count(name)) continue;
    if (!absl::SimpleAtod(flags.values.at(name), out) || !(*out >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", flags.values.at(name), "' is not a number >= 0"));
    }
    *out *= scale;
  }
  return f;
}

// The point's replica and workload on top of the flags' setup.
absl::Status Configure(const json& run, const std::vector<json>& runs, const std::string& dir, const SpecFlags& sf,
                       SimSetup* s, std::vector<SimRequest>* requests) {
  const json& p = runs.front()["point"];
  const json& w = run["spec"]["workload"];
  ReplicaConfig& r = s->replica;
  auto num = [](const json& j, const char* k, double d) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : d; };
  r.scheduler.max_num_seqs = static_cast<int32_t>(num(p, "max_num_seqs", r.scheduler.max_num_seqs));
  r.scheduler.max_num_batched_tokens = static_cast<int32_t>(num(p, "max_num_batched_tokens", r.scheduler.max_num_batched_tokens));
  if (run["spec"].contains("admission")) {  // the server's admission control
    const json& a = run["spec"]["admission"];
    r.admission.max_queue_len = static_cast<int32_t>(num(a, "max_queue_len", 0));
    r.admission.max_queue_delay_ms = num(a, "max_queue_delay_ms", 0);
    r.admission.ttft_slo_ms = num(a, "ttft_slo_ms", 0);
  }
  if (runs.front().contains("scheduler")) {  // the replica as it ran
    const json& sc = runs.front()["scheduler"];
    r.scheduler.num_blocks = static_cast<int32_t>(num(sc, "num_blocks", r.scheduler.num_blocks));
    r.scheduler.block_size = static_cast<int32_t>(num(sc, "block_size", r.scheduler.block_size));
    r.scheduler.max_model_len = static_cast<int32_t>(num(sc, "max_model_len", r.scheduler.max_model_len));
  }
  const std::string method = p.value("spec_method", "none");
  const int32_t k = static_cast<int32_t>(num(p, "num_spec_tokens", 4));
  r.speculate = method != "none" && !p["spec_method"].is_null();
  r.adaptive = r.speculate && k == 0;
  const int32_t max_k = static_cast<int32_t>(num(run["spec"], "max_spec_tokens", 0));
  r.scheduler.num_spec_tokens = !r.speculate ? 0 : r.adaptive ? (max_k > 0 ? max_k : 8) : k;
  if (method != "draft") r.draft_shape.reset();
  if (method != "draft" && sf.propose_s >= 0) r.propose_seconds_per_seq = sf.propose_s;
  if (r.speculate && !sf.acceptance_given) {
    const std::vector<double> conditional = MeasuredConditionalAcceptance(runs);
    auto a = conditional.empty() ? PositionalAcceptance::FromPerPosition(MeasuredAcceptance(runs), sf.spread)
                                 : PositionalAcceptance::Create(conditional, sf.spread);
    if (!a.ok()) return a.status();
    if (method != "draft") a->set_proposal_rate(ProposalRate(runs));
    s->acceptance = std::make_unique<PositionalAcceptance>(*std::move(a));
  }
  s->spec_label = !r.speculate ? "none" : absl::StrCat(method, r.adaptive ? " auto" : absl::StrCat(" k=", k));
  if (runs.front().contains("trace") && runs.front()["trace"].is_string()) {
    const std::string trace = runs.front()["trace"].get<std::string>();
    std::string note;
    auto t = LoadTrace(dir + "/" + trace, &note);
    if (!t.ok()) return t.status();
    if (!note.empty()) std::fprintf(stderr, "[simulate] %s: %s\n", trace.c_str(), note.c_str());
    *requests = *std::move(t);
    if (w.contains("synthetic")) {
      for (SimRequest& q : *requests) q.text_prompt = false;  // token ids (traces before prompt_text)
    }
    // An n-gram point's trace records what the lookup found and matched at each step: replayed.
    if (method == "ngram" && !sf.acceptance_given) s->acceptance = WithDraftProfiles(*requests, std::move(s->acceptance));
    return absl::OkStatus();
  }
  if (!w.contains("synthetic") || !w["synthetic"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": a prompts-file workload needs traces (the spec's record_trace) to replay"));
  }
  SyntheticWorkload sw;
  sw.prompt_len = static_cast<int32_t>(num(w["synthetic"], "input_len", 128));
  sw.output_len = static_cast<int32_t>(num(w["synthetic"], "output_len", 128));
  ArrivalOptions& a = sw.arrivals;
  a.num_requests = static_cast<int32_t>(num(w, "num_requests", 64));
  if (a.num_requests == 0) a.num_requests = 64;
  uint64_t seed = 0;
  if (w.contains("seed")) {
    if (w["seed"].is_string()) (void)absl::SimpleAtoi(w["seed"].get<std::string>(), &seed);
    if (w["seed"].is_number()) seed = w["seed"].get<uint64_t>();
  }
  a.seed = seed;
  a.request_rate = p["request_rate"].is_number() ? p["request_rate"].get<double>() : INFINITY;
  a.burstiness = num(p, "burstiness", 1);
  a.burst_factor = num(p, "burst_factor", 1);
  a.burst_start_s = num(run["spec"], "burst_start_s", 0);
  a.burst_duration_s = num(run["spec"], "burst_duration_s", 0);
  *requests = MakeRequests(sw);
  for (SimRequest& q : *requests) q.text_prompt = false;  // a synthetic workload sends token ids
  return absl::OkStatus();
}

// The step-time model against the steps the runs ran (their .steps.jsonl beside the trace, where
// recorded): per kind, the predicted total (expected) time and the measured, and the steps' count. Null when
// no run recorded steps.
json StepCheck(const StepTimeModel& model, const std::vector<json>& runs, const std::string& dir) {
  std::map<std::string, std::array<double, 3>> by_kind;  // kind -> {measured s, predicted s, steps}
  for (const json& run : runs) {
    if (!run.contains("trace") || !run["trace"].is_string()) continue;
    std::string path = dir + "/" + run["trace"].get<std::string>();
    if (path.size() > 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0) path.resize(path.size() - 6);
    std::ifstream in(path + ".steps.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("seconds") || !j.contains("kind")) continue;
      const StepWork w{At(j, {"seqs"}), At(j, {"tokens"}), At(j, {"rows"}), At(j, {"positions"})};
      for (const std::string& kind : {j["kind"].get<std::string>(), std::string("all")}) {
        auto& k = by_kind[kind];
        k[0] += j["seconds"].get<double>();
        k[1] += model.Seconds(w);  // the expected time (the jitter's mean is 1)
        k[2] += 1;
      }
    }
  }
  if (by_kind.empty()) return nullptr;
  json out = json::object();
  for (const auto& [kind, k] : by_kind) out[kind] = {{"measured_s", k[0]}, {"predicted_s", k[1]}, {"steps", k[2]}};
  return out;
}

// The simulated steps in the format of an experiment's step log (experiments/runner.cc), to set
// beside a run's.
absl::Status WriteSteps(const std::vector<SimStep>& steps, const std::string& path) {
  std::ofstream out(path);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  for (const SimStep& s : steps) {
    const StepWork w = RanWork(s.plan, s.result);
    out << nlohmann::ordered_json({{"start_s", s.start_s}, {"seconds", s.seconds}, {"kind", StepKind(s.plan, w)},
                                   {"seqs", w.seqs}, {"tokens", w.tokens}, {"rows", w.rows}, {"positions", w.positions}})
               .dump()
        << "\n";
  }
  return out ? absl::OkStatus() : absl::DataLossError(absl::StrCat(path, ": write failed"));
}

// The simulated requests in the format of an experiment's trace (experiments/runner.cc), to set
// beside a run's; a replica keeps its records in the order they arrived.
absl::Status WriteRequests(const std::vector<SimRequestRecord>& records, const std::string& path) {
  std::ofstream out(path);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  using Line = nlohmann::ordered_json;
  for (const SimRequestRecord& r : records) {
    const bool ok = r.refused.empty() && r.finish_s >= 0;
    const double at = r.request.arrival_s;
    Line j = {{"arrival_s", at}, {"prompt_tokens", r.request.prompt_len}, {"output_tokens", r.output_tokens},
              {"ttft_ms", r.first_token_s >= 0 ? Line(1e3 * (r.first_token_s - at)) : Line()},
              {"e2e_ms", ok ? Line(1e3 * (r.finish_s - at)) : Line()},
              {"finish_s", ok ? Line(r.finish_s) : Line()}, {"ok", ok}};
    if (!r.refused.empty()) j["error"] = r.refused;
    out << j.dump() << "\n";
  }
  return out ? absl::OkStatus() : absl::DataLossError(absl::StrCat(path, ": write failed"));
}

GoodputSlo SloOf(const json& run) {
  GoodputSlo slo;
  const json s = run.value("slo", json::object());
  if (s.contains("ttft_ms")) slo.ttft_ms = s["ttft_ms"].get<double>();
  if (s.contains("tpot_ms")) slo.tpot_ms = s["tpot_ms"].get<double>();
  if (s.contains("e2el_ms")) slo.e2el_ms = s["e2el_ms"].get<double>();
  return slo;
}

void PrintPoint(const json& point) {
  std::printf("%s\n", point["params"].dump().c_str());
  std::printf("  %-14s %12s %12s %9s %21s\n", "metric", "measured", "predicted", "error", "measured range");
  for (const auto& [path, key] : Metrics()) {
    const json& m = point["measured"][key];
    const json& p = point["predicted"][key];
    if (m.is_null() || p.is_null()) continue;
    const double mv = m.get<double>(), pv = p.get<double>();
    const std::string err = mv != 0 ? absl::StrFormat("%+.1f%%", 100 * (pv - mv) / mv) : "-";
    std::printf("  %-14s %12.2f %12.2f %9s   [%8.2f, %8.2f]\n", key, mv, pv, err.c_str(),
                point["measured"]["min"][key].get<double>(), point["measured"]["max"][key].get<double>());
  }
  if (!point.contains("step_times") || point["step_times"].is_null()) return;
  std::printf("  step times, the model over the runs' own steps:");
  for (const auto& [kind, k] : point["step_times"].items()) {
    const double m = k["measured_s"].get<double>(), p = k["predicted_s"].get<double>();
    std::printf(" %s %+.1f%% (%.0f)", kind.c_str(), m > 0 ? 100 * (p - m) / m : 0.0, k["steps"].get<double>());
  }
  std::printf("\n");
}

}  // namespace

absl::Status RunValidate(const Flags& flags) {
  const std::string dir = flags.values.at("validate");
  ASSIGN_OR_RETURN(json run, ReadJson(dir + "/run.json"));
  if (run.value("mode", "") != "ONLINE") {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": an ONLINE experiment is needed (run.json says ", run.value("mode", "?"), ")"));
  }
  ASSIGN_OR_RETURN(auto points, ReadPoints(dir + "/results.jsonl"));
  // The flags' setup once (the cost file read and fitted once); each point starts from a copy.
  ASSIGN_OR_RETURN(const SimSetup base, SimSetupFromFlags(flags));
  ASSIGN_OR_RETURN(const SpecFlags spec_flags, ReadSpecFlags(flags));
  json out = {{"points", json::array()},
              {"cost", {{"origin", CostOriginName(base.replica.target.origin())},
                        {"description", base.replica.target.description()}}}};
  for (const std::vector<json>& runs : points) {
    SimSetup setup;
    setup.replica = base.replica;
    setup.acceptance = base.acceptance->Fresh();
    setup.seed = base.seed;
    std::vector<SimRequest> requests;
    RETURN_IF_ERROR(Configure(run, runs, dir, spec_flags, &setup, &requests));
    FleetConfig fc;
    fc.replica = setup.replica;
    fc.seed = setup.seed;
    fc.record_steps = flags.values.count("steps-out") > 0;
    const FleetResult r = Simulate(fc, requests, setup.acceptance.get(), SloOf(run));
    if (fc.record_steps) {
      const std::string stem = absl::StrCat(flags.values.at("steps-out"), "/point-", out["points"].size());
      RETURN_IF_ERROR(WriteSteps(r.replicas.front()->steps(), stem + ".steps.jsonl"));
      RETURN_IF_ERROR(WriteRequests(r.replicas.front()->records(), stem + ".jsonl"));
    }
    json predicted = SimSummaryJson(r.fleet);
    predicted["goodput"] = r.fleet.goodput;
    out["points"].push_back({{"params", runs.front()["point"]}, {"measured", Measured(runs)}, {"predicted", predicted},
                             {"step_times", StepCheck(setup.replica.target, runs, dir)}});
  }
  if (flags.switches.count("json")) {
    std::cout << out.dump(1) << "\n";
    return absl::OkStatus();
  }
  std::printf("[simulate] validating against %s; step times: %s, %s\n", dir.c_str(),
              out["cost"]["origin"].get<std::string>().c_str(), out["cost"]["description"].get<std::string>().c_str());
  for (const json& p : out["points"]) PrintPoint(p);
  return absl::OkStatus();
}

}  // namespace specula

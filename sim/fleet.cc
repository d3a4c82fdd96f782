#include "sim/fleet.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <queue>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specula {

absl::StatusOr<Routing> ParseRouting(const std::string& name) {
  if (name == "round_robin") return Routing::kRoundRobin;
  if (name == "least_outstanding") return Routing::kLeastOutstanding;
  if (name == "session") return Routing::kSessionAffinity;
  return absl::InvalidArgumentError(
      absl::StrCat("routing '", name, "': expected round_robin, least_outstanding or session"));
}

const char* RoutingName(Routing r) {
  switch (r) {
    case Routing::kRoundRobin: return "round_robin";
    case Routing::kLeastOutstanding: return "least_outstanding";
    case Routing::kSessionAffinity: return "session";
  }
  return "?";
}

std::vector<SimRequest> MakeRequests(const SyntheticWorkload& w) {
  const std::vector<double> t = ArrivalTimes(w.arrivals);
  std::mt19937_64 rng(w.arrivals.seed ^ 0x9e3779b97f4a7c15ull);
  auto length = [&](int32_t len) {
    if (w.len_spread <= 0) return len;
    std::uniform_real_distribution<double> u(1 - w.len_spread, 1 + w.len_spread);
    return std::max(1, static_cast<int32_t>(std::lround(len * u(rng))));
  };
  std::vector<SimRequest> out(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    SimRequest& r = out[i];
    r.id = static_cast<int64_t>(i);
    r.arrival_s = t[i];
    r.prompt_len = length(w.prompt_len);
    r.output_len = length(w.output_len);
    if (w.num_sessions > 0) {
      r.session = static_cast<int64_t>(i % w.num_sessions);
      r.shared_prefix = static_cast<int32_t>(w.prefix_reuse * r.prompt_len);
    }
  }
  return out;
}

namespace {

// A trace line's drafts_found and drafts_matched into r->drafts; the error names the field.
std::string ReadDraftProfile(const nlohmann::json& j, SimRequest* r) {
  const bool found = j.contains("drafts_found"), matched = j.contains("drafts_matched");
  if (!found && !matched) return "";
  if (found != matched) return "fields 'drafts_found' and 'drafts_matched' come together";
  const size_t n = static_cast<size_t>(std::max(r->output_len - 1, 0));
  using Field = std::pair<const char*, std::vector<int32_t>*>;
  for (auto [f, out] : {Field{"drafts_found", &r->drafts.found}, Field{"drafts_matched", &r->drafts.matched}}) {
    const nlohmann::json& a = j[f];
    if (!a.is_array() || a.size() != n) return absl::StrCat("field '", f, "' must be an array of output_tokens - 1 (", n, ") counts");
    for (const nlohmann::json& v : a) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1024) {
        return absl::StrCat("field '", f, "' must hold integers in [0, 1024]");
      }
      out->push_back(v.get<int32_t>());
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (r->drafts.matched[i] > r->drafts.found[i]) return absl::StrCat("field 'drafts_matched' exceeds 'drafts_found' at ", i);
  }
  return "";
}

// Which of a trace line's lengths the server did not record: a request it refused (or that failed
// before its first token) has 0 for them.
struct Unrecorded {
  bool prompt = false, output = false;
  bool ok = true;  // completed: its lengths stand for its prompt's and in the medians
  bool any() const { return prompt || output; }
};

// Such a request still arrives, and a simulated replica may admit it, so it needs the lengths it
// would have had: those of a completed request of the same prompt (under greedy decoding the same
// output), else the completed ones' medians. Returns how many took each; an error when no request
// completed.
absl::StatusOr<std::pair<int32_t, int32_t>> FillUnservedLengths(std::vector<SimRequest>* requests,
                                                                const std::vector<Unrecorded>& unserved) {
  std::map<int64_t, const SimRequest*> served_prompt;  // prompt_id -> its first completed request
  std::vector<int32_t> prompt_lens, output_lens;
  for (size_t i = 0; i < requests->size(); ++i) {
    if (!unserved[i].ok) continue;
    const SimRequest& r = (*requests)[i];
    if (r.prompt_id >= 0) served_prompt.try_emplace(r.prompt_id, &r);
    prompt_lens.push_back(r.prompt_len);
    output_lens.push_back(r.output_len);
  }
  const int32_t n =
      static_cast<int32_t>(std::count_if(unserved.begin(), unserved.end(), [](Unrecorded u) { return u.any(); }));
  if (n == 0) return std::make_pair(0, 0);
  if (prompt_lens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no request completed (\"ok\": true) to give the lengths of the ", n,
                                                   " that the server refused or that failed before a token"));
  }
  const int32_t prompt_median = UpperMedian(prompt_lens), output_median = UpperMedian(output_lens);
  int32_t same_prompt = 0;
  for (size_t i = 0; i < requests->size(); ++i) {
    if (!unserved[i].any()) continue;
    SimRequest& r = (*requests)[i];
    auto it = served_prompt.find(r.prompt_id);
    const bool same = r.prompt_id >= 0 && it != served_prompt.end();
    same_prompt += same;
    if (unserved[i].prompt) r.prompt_len = same ? it->second->prompt_len : prompt_median;
    if (unserved[i].output) r.output_len = same ? it->second->output_len : output_median;
  }
  return std::make_pair(same_prompt, n - same_prompt);
}

}  // namespace

std::unique_ptr<AcceptanceModel> WithDraftProfiles(const std::vector<SimRequest>& requests,
                                                   std::unique_ptr<AcceptanceModel> fallback) {
  auto has_profile = [](const SimRequest& r) { return !r.drafts.found.empty(); };
  if (std::none_of(requests.begin(), requests.end(), has_profile)) return fallback;
  auto profiles = std::make_unique<ProfileAcceptance>(std::move(fallback));
  for (const SimRequest& r : requests) {
    if (has_profile(r)) profiles->Add(r.id, r.drafts);
  }
  return profiles;
}

absl::StatusOr<std::vector<SimRequest>> LoadTrace(const std::string& path, std::string* note) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<SimRequest> out;
  std::vector<Unrecorded> unserved;  // [lines]: lengths the server did not record
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", what)); };
    if (!j.is_object()) return bad("not a JSON object");
    for (const char* f : {"arrival_s", "prompt_tokens", "output_tokens"}) {
      if (!j.contains(f) || !j[f].is_number() || j[f].get<double>() < 0 || !std::isfinite(j[f].get<double>())) {
        return bad(absl::StrCat("field '", f, "' must be a number >= 0"));
      }
    }
    SimRequest r;
    r.id = static_cast<int64_t>(out.size());
    r.arrival_s = j["arrival_s"].get<double>();
    r.prompt_len = std::max(1, j["prompt_tokens"].get<int32_t>());
    r.output_len = std::max(1, j["output_tokens"].get<int32_t>());
    if (j.contains("prompt_id")) {
      if (!j["prompt_id"].is_number_integer()) return bad("field 'prompt_id' must be an integer");
      r.prompt_id = j["prompt_id"].get<int64_t>();
    }
    if (j.contains("session")) {
      if (!j["session"].is_number_integer()) return bad("field 'session' must be an integer");
      r.session = j["session"].get<int64_t>();
    }
    if (j.contains("prompt_text")) {
      if (!j["prompt_text"].is_boolean()) return bad("field 'prompt_text' must be true or false");
      r.text_prompt = j["prompt_text"].get<bool>();
    }
    if (j.contains("ok") && !j["ok"].is_boolean()) return bad("field 'ok' must be true or false");
    const bool failed = !j.value("ok", true);
    unserved.push_back(
        {failed && j["prompt_tokens"].get<double>() == 0, failed && j["output_tokens"].get<double>() == 0, !failed});
    if (std::string e = ReadDraftProfile(j, &r); !e.empty()) return bad(e);
    out.push_back(std::move(r));
  }
  auto filled = FillUnservedLengths(&out, unserved);
  if (!filled.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", filled.status().message()));
  if (note != nullptr && filled->first + filled->second > 0) {
    *note = absl::StrCat(filled->first + filled->second, " requests the server refused or that failed before a token: replayed "
                         "with the lengths of a completed request of the same prompt (", filled->first,
                         ") or the completed ones' medians (", filled->second, ")");
  }
  std::stable_sort(out.begin(), out.end(), [](const SimRequest& a, const SimRequest& b) { return a.arrival_s < b.arrival_s; });
  return out;
}

namespace {

SimSummary Summary(const std::vector<const Replica*>& replicas, const GoodputSlo& slo) {
  SimSummary s;
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t output_tokens = 0, k_sum = 0, k_count = 0, good = 0;
  double kv_block_seconds = 0, kv_blocks = 0;
  for (const Replica* r : replicas) {
    for (const SimRequestRecord& rec : r->records()) {
      ++s.requests;
      s.duration_s = std::max(s.duration_s, std::max(rec.request.arrival_s, rec.finish_s));
      if (!rec.refused.empty()) {
        ++s.refused;
        ++s.refusals[rec.refused];
        continue;
      }
      if (rec.finish_s < 0) continue;
      ++s.completed;
      output_tokens += rec.output_tokens;
      const double t = 1e3 * (rec.first_token_s - rec.request.arrival_s), e = 1e3 * (rec.finish_s - rec.request.arrival_s);
      ttft.push_back(t);
      e2e.push_back(e);
      const double p = rec.output_tokens > 1 ? (e - t) / (rec.output_tokens - 1) : 0.0;
      if (rec.output_tokens > 1) tpot.push_back(p);
      for (size_t m = 1; m < rec.message_s.size(); ++m) itl.push_back(1e3 * (rec.message_s[m] - rec.message_s[m - 1]));
      good += slo.Met(t, p, e) ? 1 : 0;
    }
    s.preemptions += r->scheduler().num_preemptions();
    s.steps += r->num_steps();
    s.draft_tokens += r->draft_tokens();
    s.accepted_tokens += r->accepted_tokens();
    for (size_t k = 0; k < r->k_histogram().size(); ++k) {
      k_sum += static_cast<int64_t>(k) * r->k_histogram()[k];
      k_count += r->k_histogram()[k];
    }
    kv_block_seconds += r->kv_block_seconds();
    kv_blocks += r->scheduler().blocks().num_blocks();
    s.kv_usage_peak = std::max(s.kv_usage_peak, double(r->kv_blocks_peak()) / r->scheduler().blocks().num_blocks());
  }
  if (s.duration_s > 0) {
    s.request_throughput = s.completed / s.duration_s;
    s.output_tok_s = output_tokens / s.duration_s;
    s.request_goodput = good / s.duration_s;
    s.kv_usage_mean = kv_blocks > 0 ? kv_block_seconds / (kv_blocks * s.duration_s) : 0.0;
  }
  s.goodput = s.requests > 0 ? static_cast<double>(good) / s.requests : 0.0;
  s.mean_k = k_count > 0 ? static_cast<double>(k_sum) / k_count : 0.0;
  s.ttft_ms = Summarize(std::move(ttft));
  s.tpot_ms = Summarize(std::move(tpot));
  s.itl_ms = Summarize(std::move(itl));
  s.e2e_ms = Summarize(std::move(e2e));
  return s;
}

size_t Route(Routing routing, const SimRequest& r, const std::vector<std::unique_ptr<Replica>>& replicas, size_t* next) {
  const size_t n = replicas.size();
  if (routing == Routing::kRoundRobin) return (*next)++ % n;
  if (routing == Routing::kSessionAffinity && r.session >= 0) return static_cast<size_t>(r.session) % n;
  size_t best = 0;
  for (size_t i = 1; i < n; ++i) {
    if (replicas[i]->outstanding() < replicas[best]->outstanding()) best = i;
  }
  return best;
}

}  // namespace

FleetResult Simulate(const FleetConfig& config, const std::vector<SimRequest>& requests, AcceptanceModel* acceptance,
                     const GoodputSlo& slo) {
  FleetResult out;
  for (int32_t i = 0; i < config.replicas; ++i) {
    out.replicas.push_back(std::make_unique<Replica>(config.replica, acceptance, config.seed * 1000003ull + i));
    out.replicas.back()->set_record_steps(config.record_steps);
  }
  std::vector<std::unique_ptr<Replica>>& reps = out.replicas;
  // Step ends by time, ties by replica: a min-heap of (end, replica).
  using End = std::pair<double, size_t>;
  std::priority_queue<End, std::vector<End>, std::greater<End>> ends;
  auto start = [&](size_t r, double t) {
    if (auto d = reps[r]->Begin(t)) ends.push({t + *d, r});
  };
  size_t next_arrival = 0, rr = 0;
  const double inf = std::numeric_limits<double>::infinity();
  while (next_arrival < requests.size() || !ends.empty()) {
    const double t_arrival = next_arrival < requests.size() ? requests[next_arrival].arrival_s : inf;
    const double t_end = ends.empty() ? inf : ends.top().first;
    if (t_arrival < t_end) {  // an arrival exactly at a step's end waits for the next step
      const SimRequest& q = requests[next_arrival++];
      const size_t r = Route(config.routing, q, reps, &rr);
      if (reps[r]->Submit(q, t_arrival).empty() && !reps[r]->busy()) start(r, t_arrival);
      continue;
    }
    const size_t r = ends.top().second;
    ends.pop();
    if (const double delay = reps[r]->TakeDelay(); delay > 0) {  // arrivals during the step slowed it
      ends.push({t_end + delay, r});
      continue;
    }
    reps[r]->End(t_end);
    start(r, t_end);
  }
  std::vector<const Replica*> all;
  for (const auto& r : reps) {
    all.push_back(r.get());
    out.per_replica.push_back(Summary({r.get()}, slo));
  }
  out.fleet = Summary(all, slo);
  return out;
}

}  // namespace specula

#include "tools/bench_serve.h"

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "serving/conversation.h"
#include "serving/load_gen.h"
#include "core/flags.h"

namespace specula {
namespace {

using json = nlohmann::json;

struct BenchOptions {
  std::string endpoint, dataset_path, result_json, goodput_spec;
  std::vector<std::string> endpoints;  // --endpoint's comma-separated list (one unless --multi-turn)
  ClientOptions client;
  ArrivalOptions arrival;
  GoodputSlo slo;
  int32_t max_concurrency = 0, input_len = 128, output_len = 128, vocab_size = 0;
  bool output_len_given = false, progress = true, save_detailed = false;
  bool multi_turn = false;
  ConversationOptions conversation;  // --multi-turn
  std::string user_messages_path;
};

// The flags of --multi-turn alone, and those of a request schedule that a closed loop has no use for.
const std::vector<std::string> kMultiTurnFlags = {"num-sessions", "turns", "session-concurrency", "think-time-s",
                                                  "user-messages", "user-words", "system-prompt", "max-tokens",
                                                  "turn-routing", "ignore-eos"};
const std::vector<std::string> kScheduleFlags = {"num-prompts", "request-rate", "burstiness", "max-concurrency",
                                                 "burst-factor", "burst-start-s", "burst-duration-s", "dataset-path",
                                                 "input-len", "output-len", "vocab-size"};

// vLLM's `--goodput ttft:500 tpot:50` is several words: join the words after --goodput into one
// value so that ParseFlags sees --goodput "ttft:500 tpot:50".
std::vector<std::string> JoinGoodputWords(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    args.emplace_back(argv[i]);
    if (args.back() != "--goodput") continue;
    std::vector<std::string> words;
    while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) words.emplace_back(argv[++i]);
    if (!words.empty()) args.push_back(absl::StrJoin(words, " "));
  }
  return args;
}

std::string Value(const Flags& flags, const std::string& name) {
  const auto it = flags.values.find(name);
  return it == flags.values.end() ? std::string() : it->second;
}

absl::Status BadFlag(const Flags& flags, const char* name, const char* rule) {
  return absl::InvalidArgumentError(absl::StrCat("--", name, " ", rule, ", got ", Value(flags, name)));
}

// The request schedule's flags (without --multi-turn).
absl::Status ParseSchedule(const Flags& flags, BenchOptions* o) {
  auto has = [&](const char* name) { return flags.values.count(name) > 0; };
  auto bad = [&](const char* name, const char* rule) { return BadFlag(flags, name, rule); };
  ArrivalOptions& a = o->arrival;
  if (a.num_requests < 1) return bad("num-prompts", "must be >= 1");
  if (std::isnan(a.request_rate) || a.request_rate <= 0) return bad("request-rate", "must be > 0 or inf");
  if (!std::isfinite(a.burstiness) || a.burstiness <= 0) return bad("burstiness", "must be > 0");
  if (has("max-concurrency") && o->max_concurrency < 1) return bad("max-concurrency", "must be >= 1");
  if (has("burst-factor") || has("burst-start-s") || has("burst-duration-s")) {
    if (!has("burst-factor") || !has("burst-duration-s")) {
      return absl::InvalidArgumentError("a burst window needs both --burst-factor and --burst-duration-s");
    }
    if (std::isinf(a.request_rate)) return absl::InvalidArgumentError("a burst window needs a finite --request-rate");
    if (!std::isfinite(a.burst_factor) || a.burst_factor <= 0) return bad("burst-factor", "must be > 0");
    if (!std::isfinite(a.burst_start_s) || a.burst_start_s < 0) return bad("burst-start-s", "must be >= 0");
    if (!std::isfinite(a.burst_duration_s) || a.burst_duration_s <= 0) {
      return bad("burst-duration-s", "must be > 0");
    }
  }
  o->dataset_path = Value(flags, "dataset-path");
  if (!o->dataset_path.empty() && (has("input-len") || has("vocab-size"))) {
    return absl::InvalidArgumentError("--input-len and --vocab-size are for synthetic prompts, not --dataset-path");
  }
  o->output_len_given = has("output-len");
  if (o->input_len < 1) return bad("input-len", "must be >= 1");
  if (o->output_len < 1) return bad("output-len", "must be >= 1");
  if (has("vocab-size") && o->vocab_size < 1) return bad("vocab-size", "must be >= 1");
  if (o->endpoints.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("--endpoint: a list of endpoints (", o->endpoint,
                                                   ") needs --multi-turn"));
  }
  return absl::OkStatus();
}

// --multi-turn's flags: closed-loop sessions instead of a schedule.
absl::Status ParseMultiTurn(const Flags& flags, BenchOptions* o) {
  auto has = [&](const std::string& name) { return flags.values.count(name) > 0 || flags.switches.count(name) > 0; };
  auto bad = [&](const char* name, const char* rule) { return BadFlag(flags, name, rule); };
  for (const std::string& f : kScheduleFlags) {
    if (!has(f)) continue;
    const char* instead = f == "dataset-path"                      ? " (user messages: --user-messages)"
                          : f == "max-concurrency"                 ? " (sessions in flight: --session-concurrency)"
                          : f == "input-len" || f == "vocab-size"  ? " (a conversation sends text, not token ids)"
                          : f == "output-len"                      ? " (answers: --max-tokens)"
                                                                   : " (each session's next turn follows its answer)";
    return absl::InvalidArgumentError(absl::StrCat("--", f, " does not apply to --multi-turn", instead));
  }
  ConversationOptions& c = o->conversation;
  if (c.num_sessions < 1 || c.num_sessions > 1000000) return bad("num-sessions", "must be in [1, 1000000]");
  if (c.turns < 1 || c.turns > 10000) return bad("turns", "must be in [1, 10000]");
  if (has("session-concurrency") && c.session_concurrency < 1) return bad("session-concurrency", "must be >= 1");
  if (!std::isfinite(c.think_time_s) || c.think_time_s < 0) return bad("think-time-s", "must be >= 0");
  if (c.user_words < 1 || c.user_words > 100000) return bad("user-words", "must be in [1, 100000]");
  if (c.max_tokens < 1) return bad("max-tokens", "must be >= 1");
  if (has("turn-routing")) {
    auto r = ParseTurnRouting(Value(flags, "turn-routing"));
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("--turn-routing: ", r.status().message()));
    c.routing = *r;
  }
  o->user_messages_path = Value(flags, "user-messages");
  if (!o->user_messages_path.empty() && has("user-words")) {
    return absl::InvalidArgumentError("--user-words is for synthetic user messages, not --user-messages");
  }
  c.system_prompt = Value(flags, "system-prompt");
  c.ignore_eos = flags.switches.count("ignore-eos") > 0;
  c.seed = o->arrival.seed;
  return absl::OkStatus();
}

// The flags every run has: the endpoints, sampling, the timeout, goodput and the outputs.
absl::Status ParseCommon(const Flags& flags, BenchOptions* o) {
  auto get = [&](const char* name) { return Value(flags, name); };
  auto bad = [&](const char* name, const char* rule) { return BadFlag(flags, name, rule); };
  o->endpoint = get("endpoint");
  if (o->endpoint.empty()) return absl::InvalidArgumentError("--endpoint is required (grpc://HOST:PORT or http://HOST:PORT)");
  o->endpoints = absl::StrSplit(o->endpoint, ',');
  if (const char* env = std::getenv("OPENAI_API_KEY"); env != nullptr) o->client.api_key = env;
  if (flags.values.count("api-key")) o->client.api_key = get("api-key");
  if (!std::isfinite(o->client.temperature) || o->client.temperature < 0) return bad("temperature", "must be >= 0");
  if (!(o->client.request_timeout_s > 0) || o->client.request_timeout_s > 1e7) return bad("request-timeout-s", "must be > 0");
  if (flags.values.count("goodput")) {
    o->goodput_spec = get("goodput");
    auto slo = ParseGoodput(o->goodput_spec);
    if (!slo.ok()) return absl::InvalidArgumentError(absl::StrCat("--goodput: ", slo.status().message()));
    o->slo = *slo;
  }
  o->client.model = get("model");
  o->result_json = get("result-json");
  o->progress = !flags.switches.count("no-progress");
  o->save_detailed = flags.switches.count("save-detailed") > 0;
  return absl::OkStatus();
}

absl::Status Parse(int argc, char** argv, BenchOptions* o, bool* help) {
  std::vector<std::string> args = JoinGoodputWords(argc, argv);
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  std::set<std::string> known = {"endpoint", "model", "goodput", "seed", "result-json", "temperature",
                                 "request-timeout-s", "api-key"};
  known.insert(kScheduleFlags.begin(), kScheduleFlags.end());
  known.insert(kMultiTurnFlags.begin(), kMultiTurnFlags.end());
  known.erase("ignore-eos");
  auto flags = ParseFlags(static_cast<int>(ptrs.size()), ptrs.data(), known,
                          {"help", "no-progress", "save-detailed", "multi-turn", "ignore-eos"});
  if (!flags.ok()) return flags.status();
  *help = flags->switches.count("help") > 0;
  if (*help) return absl::OkStatus();
  ArrivalOptions& a = o->arrival;
  ConversationOptions& c = o->conversation;
  for (auto st : {GetNumber(*flags, "num-prompts", &a.num_requests), GetNumber(*flags, "request-rate", &a.request_rate),
                  GetNumber(*flags, "burstiness", &a.burstiness), GetNumber(*flags, "burst-factor", &a.burst_factor),
                  GetNumber(*flags, "burst-start-s", &a.burst_start_s),
                  GetNumber(*flags, "burst-duration-s", &a.burst_duration_s), GetNumber(*flags, "seed", &a.seed),
                  GetNumber(*flags, "max-concurrency", &o->max_concurrency),
                  GetNumber(*flags, "input-len", &o->input_len), GetNumber(*flags, "output-len", &o->output_len),
                  GetNumber(*flags, "vocab-size", &o->vocab_size),
                  GetNumber(*flags, "temperature", &o->client.temperature),
                  GetNumber(*flags, "request-timeout-s", &o->client.request_timeout_s),
                  GetNumber(*flags, "num-sessions", &c.num_sessions), GetNumber(*flags, "turns", &c.turns),
                  GetNumber(*flags, "session-concurrency", &c.session_concurrency),
                  GetNumber(*flags, "think-time-s", &c.think_time_s), GetNumber(*flags, "user-words", &c.user_words),
                  GetNumber(*flags, "max-tokens", &c.max_tokens)}) {
    if (!st.ok()) return st;
  }
  if (auto st = ParseCommon(*flags, o); !st.ok()) return st;
  o->multi_turn = flags->switches.count("multi-turn") > 0;
  if (o->multi_turn) return ParseMultiTurn(*flags, o);
  for (const std::string& f : kMultiTurnFlags) {
    if (flags->values.count(f) || flags->switches.count(f)) {
      return absl::InvalidArgumentError(absl::StrCat("--", f, " needs --multi-turn"));
    }
  }
  return ParseSchedule(*flags, o);
}

// Per replica, where any request named one; with sessions (--multi-turn) also the sessions each
// replica answered first and those that moved.
void PrintReplicas(const BenchSummary& s, const SessionReplicas* sessions) {
  if (s.replicas.empty()) return;
  std::printf("-------------------Per Replica--------------------\n");
  std::printf("%-32s %8s %8s %8s %8s%s\n", "replica", "requests", "ok", "rejected", "failed",
              sessions != nullptr ? " sessions" : "");
  for (const auto& [id, c] : s.replicas) {
    std::printf("%-32s %8d %8d %8d %8d", id.c_str(), c.requests, c.ok, c.rejected, c.failed);
    if (sessions != nullptr) std::printf(" %8d", sessions->FirstTurnsOf(id));
    std::printf("\n");
  }
  if (s.without_replica > 0) std::printf("%-32s %8d\n", "(no replica named)", s.without_replica);
  if (sessions != nullptr) std::printf("%-40s %-10d\n", "Sessions moved between replicas:", sessions->moved);
}

// The failures by cause, most frequent first, at most kCauseLines of them.
void PrintFailures(const BenchSummary& s) {
  constexpr size_t kCauseLines = 8;
  if (s.failed_by_error.empty()) return;
  std::vector<std::pair<std::string, int32_t>> causes(s.failed_by_error.begin(), s.failed_by_error.end());
  std::stable_sort(causes.begin(), causes.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::printf("----------------Failures by Cause-----------------\n");
  int32_t rest = 0;
  for (size_t i = 0; i < causes.size(); ++i) {
    if (i < kCauseLines) std::printf("%8d  %s\n", causes[i].second, causes[i].first.c_str());
    else rest += causes[i].second;
  }
  if (causes.size() > kCauseLines) {
    std::printf("%8d  (%zu other causes; --result-json's failed_by_error has them all)\n", rest,
                causes.size() - kCauseLines);
  }
}

void PrintTable(const BenchOptions& o, const BenchSummary& s, const RunResult& run,
                const SessionReplicas* sessions = nullptr) {
  auto row = [](const char* name, double v, int decimals = 2) { std::printf("%-40s %-10.*f\n", name, decimals, v); };
  auto title = [](const char* t) { std::printf("%s\n", t); };
  auto stats = [&](const char* kind, const Stats& st) {
    row(absl::StrCat("Mean ", kind, " (ms):").c_str(), st.mean);
    row(absl::StrCat("Median ", kind, " (ms):").c_str(), st.median);
    row(absl::StrCat("P99 ", kind, " (ms):").c_str(), st.p99);
  };
  title("============ Serving Benchmark Result ============");
  row("Successful requests:", s.completed, 0);
  row("Rejected requests:", s.rejected, 0);
  row("Failed requests:", s.failed, 0);
  if (o.max_concurrency > 0) row("Maximum request concurrency:", o.max_concurrency, 0);
  row("Benchmark duration (s):", s.duration_s);
  row("Total input tokens:", static_cast<double>(s.total_input_tokens), 0);
  row("Total generated tokens:", static_cast<double>(s.total_output_tokens), 0);
  row("Request throughput (req/s):", s.request_throughput);
  if (!o.goodput_spec.empty()) row("Request goodput (req/s):", s.request_goodput);
  row("Output token throughput (tok/s):", s.output_throughput);
  row("Total token throughput (tok/s):", s.total_token_throughput);
  title("---------------Time to First Token----------------");
  stats("TTFT", s.ttft_ms);
  title("-----Time per Output Token (excl. 1st token)------");
  stats("TPOT", s.tpot_ms);
  title("-----Inter-token Latency (per streamed message)---");
  stats("ITL", s.itl_ms);
  row("Tokens per message:", s.tokens_per_message);
  title("----------------End-to-end Latency----------------");
  stats("E2EL", s.e2el_ms);
  if (s.rejected > 0) {
    title("-----------------Rejection Latency----------------");
    stats("rejection", s.rejection_ms);
  }
  PrintReplicas(s, sessions);
  PrintFailures(s);
  title("==================================================");
  std::fflush(stdout);
  // With --max-concurrency, waiting for a slot is the point; without it, lag means this client
  // (kMaxInFlightDefault threads, or the machine) could not keep the schedule.
  if (o.max_concurrency == 0 && run.max_send_lag_s > 0.05) {
    std::fprintf(stderr, "[bench-serve] note: requests left up to %.3f s after their arrival time: the client "
                 "could not keep up (%d threads at most)\n", run.max_send_lag_s, kMaxInFlightDefault);
  }
}

// What every run's JSON has: the endpoint, the model, sampling, and the summary's metrics.
json SummaryJson(const BenchOptions& o, const std::string& model, const BenchSummary& s, const RunResult& run) {
  json j = {{"endpoint", o.endpoint}, {"backend", o.endpoint.substr(0, o.endpoint.find(':'))}, {"model_id", model},
            {"seed", o.arrival.seed}, {"temperature", o.client.temperature}, {"duration", s.duration_s},
            {"completed", s.completed}, {"rejected", s.rejected}, {"failed", s.failed},
            {"total_input_tokens", s.total_input_tokens}, {"total_output_tokens", s.total_output_tokens},
            {"request_throughput", s.request_throughput}, {"output_throughput", s.output_throughput},
            {"total_token_throughput", s.total_token_throughput}, {"tokens_per_message", s.tokens_per_message},
            {"max_send_lag_s", run.max_send_lag_s}, {"errors", s.first_errors}};
  json goodput;  // null without --goodput, as vLLM
  if (o.slo.ttft_ms) goodput["ttft"] = *o.slo.ttft_ms;
  if (o.slo.tpot_ms) goodput["tpot"] = *o.slo.tpot_ms;
  if (o.slo.e2el_ms) goodput["e2el"] = *o.slo.e2el_ms;
  j["goodput"] = goodput;
  j["request_goodput"] = o.goodput_spec.empty() ? json() : json(s.request_goodput);
  for (auto [name, st] : {std::pair{"ttft", &s.ttft_ms}, {"tpot", &s.tpot_ms}, {"itl", &s.itl_ms},
                          {"e2el", &s.e2el_ms}, {"rejection", &s.rejection_ms}}) {
    j[absl::StrCat("mean_", name, "_ms")] = st->mean;
    j[absl::StrCat("median_", name, "_ms")] = st->median;
    j[absl::StrCat("p99_", name, "_ms")] = st->p99;
  }
  return j;
}

// "failed_by_error" always; where any request named a replica, "replicas" (with "sessions" under
// --multi-turn), "requests_without_replica", and under --multi-turn "sessions_moved".
void AddReplicasAndFailures(const BenchSummary& s, const SessionReplicas* sessions, json* j) {
  json causes = json::object();
  for (const auto& [error, n] : s.failed_by_error) causes[error] = n;
  (*j)["failed_by_error"] = causes;
  if (s.replicas.empty()) return;
  json replicas = json::object();
  for (const auto& [id, c] : s.replicas) {
    json r = {{"requests", c.requests}, {"ok", c.ok}, {"rejected", c.rejected}, {"failed", c.failed}};
    if (sessions != nullptr) r["sessions"] = sessions->FirstTurnsOf(id);
    replicas[id] = r;
  }
  (*j)["replicas"] = replicas;
  (*j)["requests_without_replica"] = s.without_replica;
  if (sessions != nullptr) (*j)["sessions_moved"] = sessions->moved;
}

// "answered_by" and "model_versions": the completed requests by the path and the model version the
// server named.
void AddPathsAndVersions(const RunResult& run, json* j) {
  json paths = json::object(), versions = json::object();
  for (const RequestResult& r : run.requests) {
    if (r.outcome != Outcome::kOk) continue;
    if (!r.answered_by.empty()) paths[r.answered_by] = paths.value(r.answered_by, 0) + 1;
    if (!r.model_version.empty()) versions[r.model_version] = versions.value(r.model_version, 0) + 1;
  }
  (*j)["answered_by"] = paths;
  (*j)["model_versions"] = versions;
}

const char* OutcomeName(Outcome o) { return o == Outcome::kOk ? "ok" : o == Outcome::kRejected ? "rejected" : "failed"; }

json ResultJson(const BenchOptions& o, const std::string& model, const BenchSummary& s, const RunResult& run) {
  const ArrivalOptions& a = o.arrival;
  json j = SummaryJson(o, model, s, run);
  AddReplicasAndFailures(s, nullptr, &j);
  AddPathsAndVersions(run, &j);
  j.update({{"num_prompts", a.num_requests},
            {"request_rate", std::isinf(a.request_rate) ? json("inf") : json(a.request_rate)},
            {"burstiness", a.burstiness}, {"max_concurrency", o.max_concurrency > 0 ? json(o.max_concurrency) : json()},
            {"dataset", o.dataset_path.empty() ? "synthetic" : o.dataset_path}});
  if (o.dataset_path.empty()) {
    j["input_len"] = o.input_len;
    j["output_len"] = o.output_len;
  }
  if (a.burst_duration_s > 0) {
    j["burst"] = {{"factor", a.burst_factor}, {"start_s", a.burst_start_s}, {"duration_s", a.burst_duration_s}};
  }
  if (o.save_detailed) {  // seconds, as vLLM's detailed arrays
    json send = json::array(), ttft = json::array(), e2el = json::array(), itls = json::array(), in = json::array(),
         out = json::array(), outcome = json::array(), errors = json::array(), replicas = json::array(),
         answered_by = json::array(), versions = json::array();
    for (const RequestResult& r : run.requests) {
      send.push_back(r.send_s);
      ttft.push_back(r.ttft_s);
      e2el.push_back(r.e2e_s);
      itls.push_back(r.itl_s);
      in.push_back(r.prompt_tokens);
      out.push_back(r.output_tokens);
      outcome.push_back(OutcomeName(r.outcome));
      errors.push_back(r.error);
      replicas.push_back(r.replica);
      answered_by.push_back(r.answered_by);
      versions.push_back(r.model_version);
    }
    j.update({{"send_times", send}, {"ttfts", ttft}, {"e2els", e2el}, {"itls", itls}, {"input_lens", in},
              {"output_lens", out}, {"outcomes", outcome}, {"request_errors", errors}, {"request_replicas", replicas},
              {"request_answered_by", answered_by}, {"request_model_versions", versions}});
  }
  return j;
}

// A progress bar on stderr, redrawn at most every 100 ms; none without `enabled`.
std::function<void(int32_t, int32_t)> ProgressBar(bool enabled, const char* what) {
  if (!enabled) return nullptr;
  auto last_draw = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now() -
                                                                            std::chrono::seconds(1));
  return [last_draw, what](int32_t done, int32_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - *last_draw < std::chrono::milliseconds(100)) return;
    *last_draw = now;
    const int width = 30, filled = width * done / std::max(total, 1);
    std::fprintf(stderr, "\r[%.*s%*s] %d/%d %s", filled, "##############################", width - filled, "", done,
                 total, what);
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

absl::Status WriteJson(const std::string& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) return absl::InvalidArgumentError(absl::StrCat("--result-json: cannot write ", path));
  return absl::OkStatus();
}

// ---- --multi-turn.

void PrintTurns(const BenchOptions& o, const ConversationRun& conv, const std::vector<TurnSummary>& turns) {
  auto row = [](const char* name, const std::string& v) { std::printf("%-40s %s\n", name, v.c_str()); };
  std::printf("=============== Multi-turn Sessions ==============\n");
  row("Sessions completed:", absl::StrCat(conv.sessions_completed));
  row("Sessions ended by a failed turn:", absl::StrCat(conv.sessions_failed));
  row("Turn routing:", absl::StrCat(TurnRoutingName(o.conversation.routing), " over ", o.endpoints.size(),
                                    o.endpoints.size() == 1 ? " endpoint" : " endpoints"));
  std::printf("%-5s %6s %6s %6s %10s %10s %10s %10s %10s %10s\n", "turn", "sent", "ok", "failed", "TTFT mean",
              "TTFT p50", "TTFT p90", "prompt", "cached", "output");
  for (const TurnSummary& t : turns) {
    std::printf("%-5d %6d %6d %6d %10.2f %10.2f %10.2f %10.1f %10.1f %10.1f\n", t.turn, t.sent, t.completed, t.failed,
                t.ttft_ms.mean, t.ttft_ms.median, t.ttft_ms.p90, t.mean_prompt_tokens, t.mean_cached_tokens,
                t.mean_output_tokens);
  }
  std::printf("(TTFT in ms; prompt, cached and output: mean tokens over the turns that completed)\n");
  std::printf("==================================================\n");
  std::fflush(stdout);
}

json MultiTurnJson(const BenchOptions& o, const std::string& model, const BenchSummary& s, const ConversationRun& conv,
                   const std::vector<TurnSummary>& turns, const SessionReplicas& sessions) {
  const RunResult run = conv.Sent();
  const ConversationOptions& c = o.conversation;
  json j = SummaryJson(o, model, s, run);
  AddReplicasAndFailures(s, &sessions, &j);
  AddPathsAndVersions(run, &j);
  j["multi_turn"] = {{"num_sessions", c.num_sessions}, {"turns", c.turns},
                     {"session_concurrency", c.session_concurrency > 0 ? json(c.session_concurrency) : json()},
                     {"think_time_s", c.think_time_s}, {"max_tokens", c.max_tokens}, {"ignore_eos", c.ignore_eos},
                     {"user_messages", o.user_messages_path.empty() ? json() : json(o.user_messages_path)},
                     {"user_words", o.user_messages_path.empty() ? json(c.user_words) : json()},
                     {"turn_routing", TurnRoutingName(c.routing)}, {"endpoints", o.endpoints},
                     {"sessions_completed", conv.sessions_completed}, {"sessions_failed", conv.sessions_failed}};
  j["per_turn"] = TurnsJson(turns);
  if (!o.save_detailed) return j;
  json requests = json::array();  // in the order sent; seconds, as the detailed arrays
  for (size_t k : conv.SentOrder()) {
    const RequestResult& r = conv.results[k];
    const SessionTurn& t = conv.requests[k].session;
    requests.push_back({{"session_id", t.id}, {"session", t.index}, {"turn", t.turn},
                        {"endpoint", o.endpoints[conv.endpoints[k]]}, {"send_s", r.send_s}, {"ttft_s", r.ttft_s},
                        {"e2e_s", r.e2e_s}, {"prompt_tokens", r.prompt_tokens}, {"cached_tokens", r.cached_tokens},
                        {"output_tokens", r.output_tokens}, {"outcome", OutcomeName(r.outcome)}, {"error", r.error},
                        {"replica", r.replica}, {"model_version", r.model_version}});
  }
  j["requests"] = requests;
  return j;
}

absl::Status RunMultiTurn(BenchOptions& o) {
  // The user messages are read before connecting so that a bad file fails without a server.
  if (!o.user_messages_path.empty()) {
    auto m = LoadUserMessages(o.user_messages_path);
    if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat("--user-messages: ", m.status().message()));
    o.conversation.user_messages = std::move(*m);
  }
  std::vector<std::unique_ptr<LoadClient>> owned;  // [endpoints]
  std::vector<LoadClient*> clients;                 // [endpoints], into owned
  for (const std::string& e : o.endpoints) {
    auto c = ConnectLoadClient(e, o.client);
    if (!c.ok()) return c.status();
    clients.push_back(c->get());
    owned.push_back(std::move(*c));
  }
  const ConversationOptions& c = o.conversation;
  const std::string model = clients[0]->info().model;
  std::fprintf(stderr, "[bench-serve] %s (%s): %d sessions of %d turns, %s at once, routing %s\n", o.endpoint.c_str(),
               model.c_str(), c.num_sessions, c.turns,
               c.session_concurrency > 0 ? absl::StrCat(c.session_concurrency).c_str() : "all",
               TurnRoutingName(c.routing));
  o.conversation.on_progress = ProgressBar(o.progress, "turns");
  ConversationRun conv(o.conversation);
  RunConversations(clients, o.conversation, &conv);
  const RunResult run = conv.Sent();
  const BenchSummary s = Summarize(run, o.slo);
  const std::vector<TurnSummary> turns = SummarizeTurns(conv);
  const SessionReplicas sessions = SummarizeSessionReplicas(conv);
  PrintTable(o, s, run, &sessions);
  PrintTurns(o, conv, turns);
  if (o.result_json.empty()) return absl::OkStatus();
  return WriteJson(o.result_json, MultiTurnJson(o, model, s, conv, turns, sessions));
}

}  // namespace

absl::Status RunBenchServe(int argc, char** argv) {
  BenchOptions o;
  bool help = false;
  if (auto st = Parse(argc, argv, &o, &help); !st.ok()) return st;
  if (help) {
    std::cout << kBenchServeUsage;
    return absl::OkStatus();
  }
  if (o.multi_turn) return RunMultiTurn(o);
  // The dataset is read before connecting so that a bad file fails without a server.
  std::vector<LoadRequest> dataset;
  if (!o.dataset_path.empty()) {
    auto d = LoadJsonlDataset(o.dataset_path, o.output_len_given ? o.output_len : 0);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--dataset-path: ", d.status().message()));
    dataset = std::move(*d);
  }
  auto client = ConnectLoadClient(o.endpoint, o.client);
  if (!client.ok()) return client.status();
  const ServerInfo& info = (*client)->info();
  std::vector<LoadRequest> requests;
  if (o.dataset_path.empty()) {
    const int32_t vocab = o.vocab_size > 0 ? o.vocab_size : info.vocab_size > 0 ? info.vocab_size : 256;
    requests = SyntheticDataset(o.arrival.num_requests, o.input_len, o.output_len, vocab, o.arrival.seed);
  } else {
    for (int32_t i = 0; i < o.arrival.num_requests; ++i) requests.push_back(dataset[i % dataset.size()]);
  }
  const std::vector<double> arrivals = ArrivalTimes(o.arrival);
  std::fprintf(stderr, "[bench-serve] %s (%s): %d requests, rate %s, burstiness %g, max concurrency %s\n",
               o.endpoint.c_str(), info.model.c_str(), o.arrival.num_requests,
               std::isinf(o.arrival.request_rate) ? "inf" : absl::StrCat(o.arrival.request_rate, "/s").c_str(),
               o.arrival.burstiness, o.max_concurrency > 0 ? absl::StrCat(o.max_concurrency).c_str() : "unlimited");

  RunOptions run_opt;
  run_opt.max_concurrency = o.max_concurrency;
  run_opt.on_progress = ProgressBar(o.progress, "requests");
  const RunResult run = RunLoad(**client, requests, arrivals, run_opt);
  const BenchSummary s = Summarize(run, o.slo);
  PrintTable(o, s, run);
  if (o.result_json.empty()) return absl::OkStatus();
  return WriteJson(o.result_json, ResultJson(o, info.model, s, run));
}

}  // namespace specula

#include "tools/bench_serve.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "serving/load_gen.h"
#include "core/flags.h"

namespace specula {
namespace {

using json = nlohmann::json;

struct BenchOptions {
  std::string endpoint, dataset_path, result_json, goodput_spec;
  ClientOptions client;
  ArrivalOptions arrival;
  GoodputSlo slo;
  int32_t max_concurrency = 0, input_len = 128, output_len = 128, vocab_size = 0;
  bool output_len_given = false, progress = true, save_detailed = false;
};

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

absl::Status Parse(int argc, char** argv, BenchOptions* o, bool* help) {
  std::vector<std::string> args = JoinGoodputWords(argc, argv);
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  auto flags = ParseFlags(static_cast<int>(ptrs.size()), ptrs.data(),
                          {"endpoint", "model", "num-prompts", "request-rate", "burstiness", "max-concurrency",
                           "burst-factor", "burst-start-s", "burst-duration-s", "dataset-path", "input-len",
                           "output-len", "vocab-size", "goodput", "seed", "result-json", "temperature",
                           "request-timeout-s"},
                          {"help", "no-progress", "save-detailed"});
  if (!flags.ok()) return flags.status();
  *help = flags->switches.count("help") > 0;
  if (*help) return absl::OkStatus();
  auto has = [&](const char* name) { return flags->values.count(name) > 0; };
  auto get = [&](const char* name) { return has(name) ? flags->values.at(name) : std::string(); };
  auto bad = [&](const char* name, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " ", rule, ", got ", get(name)));
  };
  ArrivalOptions& a = o->arrival;
  for (auto st : {GetNumber(*flags, "num-prompts", &a.num_requests), GetNumber(*flags, "request-rate", &a.request_rate),
                  GetNumber(*flags, "burstiness", &a.burstiness), GetNumber(*flags, "burst-factor", &a.burst_factor),
                  GetNumber(*flags, "burst-start-s", &a.burst_start_s),
                  GetNumber(*flags, "burst-duration-s", &a.burst_duration_s), GetNumber(*flags, "seed", &a.seed),
                  GetNumber(*flags, "max-concurrency", &o->max_concurrency),
                  GetNumber(*flags, "input-len", &o->input_len), GetNumber(*flags, "output-len", &o->output_len),
                  GetNumber(*flags, "vocab-size", &o->vocab_size),
                  GetNumber(*flags, "temperature", &o->client.temperature),
                  GetNumber(*flags, "request-timeout-s", &o->client.request_timeout_s)}) {
    if (!st.ok()) return st;
  }
  o->endpoint = get("endpoint");
  if (o->endpoint.empty()) return absl::InvalidArgumentError("--endpoint is required (grpc://HOST:PORT or http://HOST:PORT)");
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
  o->dataset_path = get("dataset-path");
  if (!o->dataset_path.empty() && (has("input-len") || has("vocab-size"))) {
    return absl::InvalidArgumentError("--input-len and --vocab-size are for synthetic prompts, not --dataset-path");
  }
  o->output_len_given = has("output-len");
  if (o->input_len < 1) return bad("input-len", "must be >= 1");
  if (o->output_len < 1) return bad("output-len", "must be >= 1");
  if (has("vocab-size") && o->vocab_size < 1) return bad("vocab-size", "must be >= 1");
  if (!std::isfinite(o->client.temperature) || o->client.temperature < 0) {
    return bad("temperature", "must be >= 0");
  }
  if (!(o->client.request_timeout_s > 0) || o->client.request_timeout_s > 1e7) {
    return bad("request-timeout-s", "must be > 0");
  }
  if (has("goodput")) {
    o->goodput_spec = get("goodput");
    auto slo = ParseGoodput(o->goodput_spec);
    if (!slo.ok()) return absl::InvalidArgumentError(absl::StrCat("--goodput: ", slo.status().message()));
    o->slo = *slo;
  }
  o->client.model = get("model");
  o->result_json = get("result-json");
  o->progress = !flags->switches.count("no-progress");
  o->save_detailed = flags->switches.count("save-detailed") > 0;
  return absl::OkStatus();
}

void PrintTable(const BenchOptions& o, const BenchSummary& s, const RunResult& run) {
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
  title("==================================================");
  std::fflush(stdout);
  for (const std::string& e : s.first_errors) std::fprintf(stderr, "[bench-serve] failed: %s\n", e.c_str());
  // With --max-concurrency, waiting for a slot is the point; without it, lag means this client
  // (kMaxInFlightDefault threads, or the machine) could not keep the schedule.
  if (o.max_concurrency == 0 && run.max_send_lag_s > 0.05) {
    std::fprintf(stderr, "[bench-serve] note: requests left up to %.3f s after their arrival time: the client "
                 "could not keep up (%d threads at most)\n", run.max_send_lag_s, kMaxInFlightDefault);
  }
}

json ResultJson(const BenchOptions& o, const std::string& model, const BenchSummary& s, const RunResult& run) {
  const ArrivalOptions& a = o.arrival;
  json j = {{"endpoint", o.endpoint}, {"backend", o.endpoint.substr(0, o.endpoint.find(':'))}, {"model_id", model},
            {"num_prompts", a.num_requests},
            {"request_rate", std::isinf(a.request_rate) ? json("inf") : json(a.request_rate)},
            {"burstiness", a.burstiness}, {"max_concurrency", o.max_concurrency > 0 ? json(o.max_concurrency) : json()},
            {"dataset", o.dataset_path.empty() ? "synthetic" : o.dataset_path}, {"seed", a.seed},
            {"temperature", o.client.temperature}, {"duration", s.duration_s}, {"completed", s.completed},
            {"rejected", s.rejected}, {"failed", s.failed}, {"total_input_tokens", s.total_input_tokens},
            {"total_output_tokens", s.total_output_tokens}, {"request_throughput", s.request_throughput},
            {"output_throughput", s.output_throughput}, {"total_token_throughput", s.total_token_throughput},
            {"tokens_per_message", s.tokens_per_message}, {"max_send_lag_s", run.max_send_lag_s},
            {"errors", s.first_errors}};
  if (o.dataset_path.empty()) {
    j["input_len"] = o.input_len;
    j["output_len"] = o.output_len;
  }
  if (a.burst_duration_s > 0) {
    j["burst"] = {{"factor", a.burst_factor}, {"start_s", a.burst_start_s}, {"duration_s", a.burst_duration_s}};
  }
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
  if (o.save_detailed) {  // seconds, as vLLM's detailed arrays
    json send = json::array(), ttft = json::array(), e2el = json::array(), itls = json::array(), in = json::array(),
         out = json::array(), outcome = json::array(), errors = json::array();
    for (const RequestResult& r : run.requests) {
      send.push_back(r.send_s);
      ttft.push_back(r.ttft_s);
      e2el.push_back(r.e2e_s);
      itls.push_back(r.itl_s);
      in.push_back(r.prompt_tokens);
      out.push_back(r.output_tokens);
      outcome.push_back(r.outcome == Outcome::kOk ? "ok" : r.outcome == Outcome::kRejected ? "rejected" : "failed");
      errors.push_back(r.error);
    }
    j.update({{"send_times", send}, {"ttfts", ttft}, {"e2els", e2el}, {"itls", itls}, {"input_lens", in},
              {"output_lens", out}, {"outcomes", outcome}, {"request_errors", errors}});
  }
  return j;
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
  auto last_draw = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  if (o.progress) {
    run_opt.on_progress = [&](int32_t done, int32_t total) {
      const auto now = std::chrono::steady_clock::now();
      if (done < total && now - last_draw < std::chrono::milliseconds(100)) return;
      last_draw = now;
      const int width = 30, filled = width * done / total;
      std::fprintf(stderr, "\r[%.*s%*s] %d/%d requests", filled, "##############################", width - filled, "",
                   done, total);
      if (done == total) std::fputc('\n', stderr);
      std::fflush(stderr);
    };
  }
  const RunResult run = RunLoad(**client, requests, arrivals, run_opt);
  const BenchSummary s = Summarize(run, o.slo);
  PrintTable(o, s, run);
  if (!o.result_json.empty()) {
    std::ofstream out(o.result_json);
    out << ResultJson(o, info.model, s, run).dump(2) << "\n";
    if (!out) return absl::InvalidArgumentError(absl::StrCat("--result-json: cannot write ", o.result_json));
  }
  return absl::OkStatus();
}

}  // namespace specula

#include "experiments/runner.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"
#include "engine/engine_setup.h"
#include "engine/run.h"
#include "request/boundary.h"
#include "serving/conversation.h"
#include "serving/load_gen.h"
#include "serving/server.h"
#include "draft/ngram_proposer.h"
#include "experiments/draft_profile.h"
#include "experiments/in_process_client.h"
#include "experiments/step_periods.h"
#include "sim/step_time.h"
#include "spec/cost_cache.h"

namespace specula::experiments {
namespace {

// The engine of a point: the spec's model and workload, the point's batching and speculation.
EngineOptions PointOptions(const Experiment& s, const Point& p) {
  EngineOptions o;
  o.target.model = s.model().path();
  o.target.tokenizer = s.model().tokenizer();
  if (!s.model().device().empty()) o.target.device = s.model().device();
  o.target.dtype = s.model().dtype();
  o.target.kv_cache_dtype = p.kv_cache_dtype;
  o.target.quantization = p.quantization;
  o.defaults.max_tokens = s.workload().max_tokens();
  o.defaults.sampling.temperature = static_cast<float>(p.temperature);
  o.batching.max_num_seqs = p.max_num_seqs;
  o.batching.max_num_batched_tokens = p.max_num_batched_tokens;
  if (p.spec_method != "none") {
    o.speculation.method = p.spec_method;
    o.speculation.adaptive = *p.num_spec_tokens == 0;
    o.speculation.num_spec_tokens = o.speculation.adaptive ? s.max_spec_tokens() : *p.num_spec_tokens;
    if (p.spec_method == "draft") o.speculation.draft_model = s.draft().path();
  }
  o.ignore_eos = s.workload().ignore_eos();
  // The CLI's and the server's cache of measured step costs: the runs after the first measure nothing.
  o.speculation.cost_cache = DefaultCostCacheDir();
  return o;
}

// The spec's requests: its prompts file (read when the spec loaded) cycled to num_requests, or
// synthetic token ids; none for a conversation, whose turns are made as it runs.
std::vector<LoadRequest> Workload(const LoadedSpec& s, int32_t vocab_size) {
  const v1::Workload& w = s.spec.workload();
  if (w.has_conversation()) return {};  // made turn by turn (OnlineLoad)
  if (w.has_synthetic()) {
    return SyntheticDataset(w.num_requests(), w.synthetic().input_len(), w.synthetic().output_len(), vocab_size, w.seed());
  }
  std::vector<LoadRequest> out;
  for (int32_t i = 0; i < w.num_requests(); ++i) {
    out.push_back(s.prompts[i % s.prompts.size()]);
    if (w.ignore_eos()) out.back().ignore_eos = true;
  }
  return out;
}

uint64_t HashTokens(const std::vector<std::vector<TokenId>>& outputs) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over (count, tokens...) per request
  auto mix = [&](uint64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  };
  for (const auto& tokens : outputs) {
    mix(tokens.size());
    for (TokenId t : tokens) mix(static_cast<uint32_t>(t));
  }
  return h;
}

// The point's engine: the scheduler RunPoint sized (and reports) and the loaded speculation.
EngineVariant PointEngine(const SchedulerConfig& sc, const SpecConfig& spec) {
  EngineVariant v;
  v.scheduler = sc;
  v.spec = spec;
  return v;
}

// One short request through a new engine before anything is timed: the first steps of a fresh
// engine pay for first-touched memory and cold caches, which adaptive k's startup measurement
// happens to pay before its runs. Without this, "none" measured 7-18% below an adaptive k that
// chose k = 0 on every step. Its prompt fills no whole KV block, so nothing of it is cached.
// Adaptive k's larger shapes are measured here too, not between the run's steps: 3-4 forwards of
// 20-110 ms each in every SmolLM2 ONLINE run, stalls that `serve` pays only until its cost cache
// holds them, and that the simulator does not model.
absl::Status WarmUp(const LoadedEngine& e, Engine& engine, int32_t block_size) {
  engine.MeasureSpeculationCosts();
  std::vector<TokenId> ids;
  for (int32_t i = 0; i < std::max(1, block_size / 2); ++i) ids.push_back(1 + i % 7);
  RequestSpec spec = SpecDefaults(Surface::kExperiment, e.defaults().sampling);
  spec.max_tokens = 8;
  spec.ignore_eos = true;
  PromptInput input;
  input.ids = ids;
  ASSIGN_OR_RETURN(std::vector<TokenId> prompt, NormalizeRequest(Surface::kExperiment, RequestContextOf(e), input, &spec));
  RETURN_IF_ERROR(engine.AddRequest(MakeRequest(1 << 30, std::move(prompt), std::move(spec))));
  return RunToCompletion(engine).status();
}

// Request i of an offline workload, normalized under the table's experiment row: the point's
// sampling (its temperature), seed workload.seed + i, max_tokens the line's or workload.max_tokens,
// capped to the room the prompt leaves.
absl::StatusOr<Request> OfflineRequest(const LoadedEngine& e, const v1::Workload& w, const LoadRequest& lr, int32_t i) {
  RequestSpec spec = SpecDefaults(Surface::kExperiment, e.defaults().sampling);
  spec.max_tokens = std::max(lr.max_tokens, 0);
  spec.seed = w.seed() + static_cast<uint64_t>(i);
  spec.ignore_eos = lr.ignore_eos || e.ignore_eos();
  spec.constraint = lr.constraint;
  PromptInput input;
  if (lr.prompt_token_ids.empty()) {
    input.text = lr.prompt;
  } else {
    input.ids = lr.prompt_token_ids;
  }
  ASSIGN_OR_RETURN(std::vector<TokenId> prompt, NormalizeRequest(Surface::kExperiment, RequestContextOf(e), input, &spec));
  return MakeRequest(i + 1, std::move(prompt), std::move(spec));
}

void SubtractPerIndex(const std::vector<int64_t>& before, std::vector<int64_t>* counts) {
  for (size_t i = 0; i < before.size() && i < counts->size(); ++i) (*counts)[i] -= before[i];
}

// The counters a run adds to `before` (the warm-up's).
EngineStats Since(const EngineStats& before, EngineStats s) {
  s.steps -= before.steps;
  s.spec.drafts -= before.spec.drafts;
  s.spec.draft_tokens -= before.spec.draft_tokens;
  s.spec.accepted_tokens -= before.spec.accepted_tokens;
  SubtractPerIndex(before.spec.accepted_per_position, &s.spec.accepted_per_position);
  SubtractPerIndex(before.spec.reached_per_position, &s.spec.reached_per_position);
  SubtractPerIndex(before.spec_k_histogram, &s.spec_k_histogram);
  return s;
}

nlohmann::json StatsJson(const Stats& s) { return {{"mean", s.mean}, {"p50", s.median}, {"p99", s.p99}}; }

// The spec's SLO as bench-serve's goodput bounds (0 = no bound), so that goodput is counted by the
// load generator's Summarize, as `bench-serve --goodput` counts it.
GoodputSlo SpecSlo(const v1::Slo& slo) {
  GoodputSlo g;
  if (slo.ttft_ms() > 0) g.ttft_ms = slo.ttft_ms();
  if (slo.tpot_ms() > 0) g.tpot_ms = slo.tpot_ms();
  if (slo.e2el_ms() > 0) g.e2el_ms = slo.e2el_ms();
  return g;
}

// The JSON of a run from the load generator's summary (with the spec's SLO), and, in process, the
// engine's counters.
nlohmann::json Measurements(const BenchSummary& b, int32_t num_requests, const EngineStats* stats, bool adaptive,
                            double peak_kv, int64_t preemptions, const std::vector<std::vector<TokenId>>* outputs) {
  nlohmann::json j;
  j["num_requests"] = num_requests;
  j["completed"] = b.completed;
  j["rejected"] = b.rejected;
  j["failed"] = b.failed;
  if (!b.first_errors.empty()) j["errors"] = b.first_errors;
  j["duration_s"] = b.duration_s;
  j["request_throughput"] = b.request_throughput;
  j["output_tok_s"] = b.output_throughput;
  j["total_tok_s"] = b.total_token_throughput;
  j["input_tokens"] = b.total_input_tokens;
  j["output_tokens"] = b.total_output_tokens;
  j["ttft_ms"] = StatsJson(b.ttft_ms);
  j["tpot_ms"] = StatsJson(b.tpot_ms);
  j["e2e_ms"] = StatsJson(b.e2el_ms);
  j["goodput"] = num_requests > 0 ? static_cast<double>(b.good) / num_requests : 0.0;
  j["request_goodput"] = b.request_goodput;
  j["spec"] = nullptr;
  j["k_histogram"] = nullptr;
  j["drafts_cannot_pay"] = nullptr;
  j["peak_kv_usage"] = stats ? nlohmann::json(peak_kv) : nlohmann::json();
  j["preemptions"] = stats ? nlohmann::json(preemptions) : nlohmann::json();
  j["steps"] = stats ? nlohmann::json(stats->steps) : nlohmann::json();
  if (stats != nullptr) {
    const SpecStats& s = stats->spec;
    std::vector<double> per_position;
    for (int64_t a : s.accepted_per_position) per_position.push_back(s.drafts ? static_cast<double>(a) / s.drafts : 0.0);
    j["spec"] = {{"drafts", s.drafts}, {"draft_tokens", s.draft_tokens}, {"accepted_tokens", s.accepted_tokens},
                 {"mean_acceptance_length", s.mean_acceptance_length()}, {"acceptance_per_position", per_position},
                 {"accepted_per_position", s.accepted_per_position}, {"reached_per_position", s.reached_per_position}};
    if (adaptive) {
      j["k_histogram"] = stats->spec_k_histogram;
      // Why an auto run may draft on no step: its startup measurement found that no acceptance
      // makes drafts pay (the draft costs about as much as the target).
      j["drafts_cannot_pay"] = stats->drafts_cannot_pay;
    }
  }
  j["output_hash"] = outputs ? nlohmann::json(absl::StrCat(absl::Hex(HashTokens(*outputs), absl::kZeroPad16)))
                             : nlohmann::json();
  return j;
}

// Offline: every request added at t = 0, the engine stepped until all finish.
absl::StatusOr<nlohmann::json> RunOffline(LoadedEngine& e, const SchedulerConfig& sc, const SpecConfig& spec_cfg,
                                          const std::vector<LoadRequest>& requests, const Experiment& spec,
                                          const RunHooks& hooks) {
  const v1::Workload& w = spec.workload();
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> made, MakeEngine(e, PointEngine(sc, spec_cfg)));
  Engine& engine = *made;
  if (auto st = WarmUp(e, engine, sc.block_size); !st.ok()) return st;
  const EngineStats warm = engine.stats();
  const int32_t n = static_cast<int32_t>(requests.size());
  for (int32_t i = 0; i < n; ++i) {
    absl::StatusOr<Request> r = OfflineRequest(e, w, requests[i], i);
    absl::Status st = r.ok() ? engine.AddRequest(*std::move(r)) : r.status();
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("workload request ", i, ": ", st.message()));
  }
  int32_t done = 0, peak_blocks = 0;
  const double start_ms = engine.NowMs();
  RunCallbacks callbacks;
  callbacks.stop = [&] { return hooks.stop && hooks.stop->load(); };
  callbacks.on_delta = [&](const RequestDelta& d) {
    if (d.finished && hooks.on_progress) hooks.on_progress(++done, n);
  };
  callbacks.after_step = [&] {
    const BlockManager& blocks = engine.scheduler().blocks();
    peak_blocks = std::max(peak_blocks, blocks.num_blocks() - blocks.num_available());
  };
  ASSIGN_OR_RETURN(std::vector<RequestOutput> finished, RunToCompletion(engine, callbacks));
  std::vector<RequestOutput> outs(n);
  for (RequestOutput& o : finished) outs[o.id - 1] = std::move(o);
  RunResult run;
  run.duration_s = (engine.NowMs() - start_ms) / 1e3;
  std::vector<std::vector<TokenId>> tokens(n);
  int64_t preemptions = 0;
  for (int32_t i = 0; i < n; ++i) {
    const RequestOutput& o = outs[i];
    RequestResult r;
    r.outcome = o.error.empty() ? Outcome::kOk : Outcome::kFailed;
    r.error = o.error;
    r.send_s = (o.arrival_ms - start_ms) / 1e3;
    r.ttft_s = (o.tokens.empty() ? o.finish_ms - o.arrival_ms : o.ttft_ms()) / 1e3;
    r.e2e_s = (o.finish_ms - o.arrival_ms) / 1e3;
    r.prompt_tokens = o.prompt_tokens;
    r.output_tokens = static_cast<int32_t>(o.tokens.size());
    run.requests.push_back(r);
    tokens[i] = o.tokens;
    preemptions += o.num_preemptions;
  }
  const double peak = static_cast<double>(peak_blocks) / engine.scheduler().blocks().num_blocks();
  const EngineStats stats = Since(warm, engine.stats());
  return Measurements(Summarize(run, SpecSlo(spec.slo())), n, &stats, spec_cfg.adaptive, peak, preemptions, &tokens);
}

ArrivalOptions Arrivals(const v1::Workload& w, const Point& p) {
  ArrivalOptions a;
  a.num_requests = w.num_requests();
  a.request_rate = *p.request_rate;
  a.burstiness = p.burstiness.value_or(1.0);
  a.burst_factor = p.burst_factor.value_or(1.0);
  a.burst_start_s = p.burst_start_s;
  a.burst_duration_s = p.burst_duration_s;
  a.seed = w.seed();
  return a;
}

// Writes `data` to `path` whole: a temporary file beside it, synced, then renamed over it.
absl::Status WriteWhole(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot write the trace"));
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  const bool ok = off == data.size() && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": writing the trace failed"));
  }
  return absl::OkStatus();
}

// An n-gram engine's drafts at each decode step of each request (DraftProfile), from the prompt as the
// server tokenized it and the tokens it streamed; empty for other engines.
std::vector<DraftProfile> NgramDraftProfiles(const LoadedEngine& e, int32_t max_k,
                                             const std::vector<LoadRequest>& requests,
                                             const std::vector<std::vector<TokenId>>& outputs) {
  const SpeculationOptions& o = e.options.speculation;
  if (o.method != "ngram" || max_k <= 0) return {};
  const NgramProposer lookup(o.ngram_min, o.ngram_max);
  std::vector<DraftProfile> out(requests.size());
  for (size_t i = 0; i < requests.size() && i < outputs.size(); ++i) {
    const LoadRequest& r = requests[i];
    const std::string text = r.messages.empty() ? r.prompt : ConversationPrompt(r.messages);
    const std::vector<TokenId> prompt = r.prompt_token_ids.empty() ? e.tokenizer->Encode(text, e.add_bos) : r.prompt_token_ids;
    out[i] = NgramDraftProfile(lookup, prompt, outputs[i], max_k);
  }
  return out;
}

// A conversation workload as the load generator's options.
ConversationOptions ConversationOf(const LoadedSpec& s) {
  const v1::Workload& w = s.spec.workload();
  const v1::Conversation& c = w.conversation();
  ConversationOptions o;
  o.num_sessions = c.sessions();
  o.turns = c.turns();
  o.session_concurrency = c.session_concurrency();
  o.think_time_s = c.think_time_s();
  o.system_prompt = c.system_prompt();
  o.user_messages = s.user_messages;
  o.user_words = c.user_words();
  o.max_tokens = w.max_tokens();
  o.ignore_eos = w.ignore_eos();
  o.seed = w.seed();
  o.routing = ParseTurnRouting(c.turn_routing()).value_or(TurnRouting::kSession);
  return o;
}

// What an ONLINE run sends: the workload's requests at the point's arrivals, or its conversations
// (closed loop). A client that knows a request by its place (InProcessClient) is made over slots().
class OnlineLoad {
 public:
  OnlineLoad(const LoadedSpec& s, const Point& p, std::vector<LoadRequest> requests)
      : spec_(s), point_(p), requests_(std::move(requests)) {
    if (s.spec.workload().has_conversation()) {
      options_ = ConversationOf(s);
      conv_ = std::make_unique<ConversationRun>(options_);
    }
  }

  const std::vector<LoadRequest>* slots() const { return conv_ ? &conv_->requests : &requests_; }

  // Through clients[0], or a conversation's turns through the client of each one's endpoint;
  // the results in the order sent.
  RunResult Run(const std::vector<LoadClient*>& clients, const RunHooks& hooks) {
    if (!conv_) {
      RunOptions ro;
      ro.on_progress = hooks.on_progress;
      return RunLoad(*clients[0], requests_, ArrivalTimes(Arrivals(spec_.spec.workload(), point_)), ro);
    }
    options_.on_progress = hooks.on_progress;
    options_.stop = hooks.stop;
    RunConversations(clients, options_, conv_.get());
    return conv_->Sent();
  }

  // The slots sent, in the order of Run's results.
  std::vector<size_t> SentSlots() const {
    if (conv_) return conv_->SentOrder();
    std::vector<size_t> all(requests_.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return all;
  }
  template <typename T>
  std::vector<T> InSentOrder(const std::vector<T>& by_slot) const {
    std::vector<T> out;
    for (size_t k : SentSlots()) out.push_back(k < by_slot.size() ? by_slot[k] : T());
    return out;
  }
  // The endpoint of each request sent, in Run's order, where a conversation has several; else empty.
  std::vector<std::string> SentEndpoints(const std::vector<std::string>& endpoints) const {
    std::vector<std::string> out;
    if (!conv_ || endpoints.size() < 2) return out;
    for (size_t k : SentSlots()) out.push_back(endpoints[conv_->endpoints[k]]);
    return out;
  }

  // A conversation's sessions and per-turn statistics for the results line; nothing otherwise.
  void AddTo(nlohmann::json* m) const {
    if (!conv_) return;
    (*m)["sessions"] = {{"completed", conv_->sessions_completed}, {"failed", conv_->sessions_failed}};
    (*m)["per_turn"] = TurnsJson(SummarizeTurns(*conv_));
  }

 private:
  const LoadedSpec& spec_;
  const Point point_;
  std::vector<LoadRequest> requests_;  // [num_requests]; empty for a conversation
  ConversationOptions options_;
  std::unique_ptr<ConversationRun> conv_;  // a conversation's requests and results, by slot
};

// An online run's steps as the engine ran them (record_trace): one JSON line each, {"start_s" (from
// the load generator's start, the zero of the trace's arrival_s), "seconds" (its period,
// experiments/step_periods.h), "kind", "seqs", "tokens", "rows", "positions"}. Filled on the loop's
// thread; read once the server is gone.
struct StepLog {
  struct Row {
    double start_s, seconds;  // start_s on the clock's own scale
    const char* kind;         // StepKind's
    StepWork work;
  };
  std::vector<Row> rows;  // [steps]
  StepPeriods periods{
      [this](const StepPeriods::Step& s, double seconds) { rows.push_back({s.start_s, seconds, s.kind, s.work}); }};
  void Attach(Engine& engine) {
    engine.set_step_observer([this, &engine](const StepPlan& p, const StepResult& result, double start_s) {
      periods.Add(p, result, start_s, engine.HasUnfinished());
    });
  }
  std::string Lines(double zero) const {
    std::string out;
    for (const Row& r : rows) {
      const nlohmann::ordered_json j = {{"start_s", r.start_s - zero}, {"seconds", r.seconds},   {"kind", r.kind},
                                        {"seqs", r.work.seqs},         {"tokens", r.work.tokens}, {"rows", r.work.rows},
                                        {"positions", r.work.positions}};
      out += j.dump() + "\n";
    }
    return out;
  }
};

std::string StepsPath(const std::string& trace_path) {
  const std::string ext = ".jsonl";
  const bool has = trace_path.size() > ext.size() && trace_path.compare(trace_path.size() - ext.size(), ext.size(), ext) == 0;
  return (has ? trace_path.substr(0, trace_path.size() - ext.size()) : trace_path) + ".steps.jsonl";
}

// The in-process server's options: the workload's default max_tokens and the spec's admission.
ServeOptions InProcessServeOptions(const LoadedEngine& e, const Experiment& spec) {
  ServeOptions so;
  so.model_name = "experiment";
  so.default_max_tokens = spec.workload().max_tokens();  // the in-process row's configured default
  so.admission.max_queue_len = spec.admission().max_queue_len();
  so.admission.max_queue_delay_ms = spec.admission().max_queue_delay_ms();
  so.admission.ttft_slo_ms = spec.admission().ttft_slo_ms();
  return so;
}

// Online in process: the serving core over the point's engine, loaded by the load generator.
absl::StatusOr<nlohmann::json> RunOnline(LoadedEngine& e, const SchedulerConfig& sc, const SpecConfig& spec_cfg,
                                         OnlineLoad& load, const Experiment& spec, const Point& p,
                                         const RunHooks& hooks) {
  const v1::Workload& w = spec.workload();
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> made, MakeEngine(e, PointEngine(sc, spec_cfg)));
  Engine& engine = *made;
  if (auto st = WarmUp(e, engine, sc.block_size); !st.ok()) return st;  // before the loop thread owns it
  const EngineStats warm = engine.stats();
  const int64_t warm_preemptions = engine.scheduler().num_preemptions();
  RunResult run;
  EngineSnapshot snap;
  std::vector<std::vector<TokenId>> tokens;  // [slots]
  StepLog steps;
  if (!hooks.trace_path.empty()) steps.Attach(engine);
  {
    ModelBundle bundle;
    bundle.engine = &engine;
    bundle.tokenizer = e.tokenizer.get();
    bundle.model = &e.model->config();
    bundle.add_bos = e.add_bos;
    Server server(std::move(bundle), InProcessServeOptions(e, spec));
    InProcessClient client(&server, load.slots(), p.temperature, w.seed());
    // Ctrl-C: abort what runs, so that the load returns soon.
    std::atomic<bool> finished{false};
    std::thread watcher([&] {
      while (!finished.load()) {
        if (hooks.stop && hooks.stop->load()) {
          server.StartDrain();
          server.CancelAll();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    run = load.Run({&client}, hooks);
    finished = true;
    watcher.join();
    if (hooks.stop && hooks.stop->load()) return absl::CancelledError("interrupted");
    server.WaitIdle(std::chrono::milliseconds(10000));
    snap = server.Snapshot();
    tokens = client.tokens();
  }
  const double peak = snap.kv_blocks_total ? static_cast<double>(snap.kv_blocks_peak) / snap.kv_blocks_total : 0.0;
  const EngineStats stats = Since(warm, snap.stats);
  steps.periods.Finish();
  if (!hooks.trace_path.empty()) {
    const std::vector<LoadRequest> sent = load.InSentOrder(*load.slots());
    const std::vector<DraftProfile> drafts = NgramDraftProfiles(e, sc.num_spec_tokens, sent, load.InSentOrder(tokens));
    RETURN_IF_ERROR(WriteWhole(hooks.trace_path, TraceJsonl(run, sent, drafts)));
    RETURN_IF_ERROR(WriteWhole(StepsPath(hooks.trace_path), steps.Lines(run.start_s)));
  }
  nlohmann::json m = Measurements(Summarize(run, SpecSlo(spec.slo())), w.num_requests(), &stats, spec_cfg.adaptive,
                                  peak, snap.num_preemptions - warm_preemptions, &tokens);
  load.AddTo(&m);
  return m;
}

// Online against the spec's endpoints (several for a conversation): the servers' engines, seen only
// through their streams.
absl::StatusOr<nlohmann::json> RunRemote(const LoadedSpec& s, const Point& p, const RunHooks& hooks) {
  const v1::Workload& w = s.spec.workload();
  ClientOptions co;
  co.temperature = p.temperature;
  const std::vector<std::string> endpoints = absl::StrSplit(s.spec.endpoint(), ',');
  std::vector<std::unique_ptr<LoadClient>> owned;  // [endpoints]
  std::vector<LoadClient*> clients;                 // [endpoints], into owned
  for (const std::string& endpoint : endpoints) {
    auto client = ConnectLoadClient(endpoint, co);
    if (!client.ok()) return client.status();
    clients.push_back(client->get());
    owned.push_back(std::move(*client));
  }
  const int32_t vocab = clients[0]->info().vocab_size > 0 ? clients[0]->info().vocab_size : 256;
  OnlineLoad load(s, p, Workload(s, vocab));
  const RunResult run = load.Run(clients, hooks);
  if (hooks.stop && hooks.stop->load()) return absl::CancelledError("interrupted");
  if (!hooks.trace_path.empty()) {
    RETURN_IF_ERROR(WriteWhole(hooks.trace_path,
                               TraceJsonl(run, load.InSentOrder(*load.slots()), {}, load.SentEndpoints(endpoints))));
  }
  nlohmann::json m =
      Measurements(Summarize(run, SpecSlo(s.spec.slo())), w.num_requests(), nullptr, false, 0, 0, nullptr);
  load.AddTo(&m);
  return m;
}

}  // namespace

absl::StatusOr<nlohmann::json> RunPoint(const LoadedSpec& s, const Point& p, const RunHooks& hooks) {
  if (!p.online && !hooks.trace_path.empty()) return absl::InvalidArgumentError("record_trace needs mode: ONLINE");
  if (p.remote) return RunRemote(s, p, hooks);
  EngineOptions options = PointOptions(s.spec, p);
  if (hooks.group != nullptr) options.target.tensor_parallel_size = hooks.group->size();
  if (hooks.before_load) RETURN_IF_ERROR(hooks.before_load(options));
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedEngine> loaded, LoadEngine(options, hooks.group));
  LoadedEngine& e = *loaded;
  auto sc = BatchSchedulerConfig(e);
  if (!sc.ok()) return sc.status();
  const SpecConfig spec_cfg = e.spec_config();
  std::vector<LoadRequest> requests = Workload(s, e.model->config().vocab_size);
  absl::StatusOr<nlohmann::json> m;
  if (p.online) {
    OnlineLoad load(s, p, std::move(requests));
    m = RunOnline(e, *sc, spec_cfg, load, s.spec, p, hooks);
  } else {
    m = RunOffline(e, *sc, spec_cfg, requests, s.spec, hooks);
  }
  // The replica as it ran (the KV pool is sized from this machine's memory): what a simulator
  // replaying the run needs (specula simulate --validate).
  if (m.ok()) {
    (*m)["scheduler"] = {{"max_num_seqs", sc->max_num_seqs}, {"max_num_batched_tokens", sc->max_num_batched_tokens},
                         {"block_size", sc->block_size}, {"num_blocks", sc->num_blocks},
                         {"max_model_len", sc->max_model_len}, {"num_spec_tokens", sc->num_spec_tokens}};
  }
  return m;
}

std::string TraceJsonl(const RunResult& run, const std::vector<LoadRequest>& requests,
                       absl::Span<const DraftProfile> drafts, absl::Span<const std::string> endpoints) {
  using Line = nlohmann::ordered_json;  // keys in the order written: arrival first
  std::map<std::pair<std::string, std::vector<int32_t>>, size_t> first;  // a prompt's first request
  std::string out;
  for (size_t i = 0; i < run.requests.size(); ++i) {
    const RequestResult& r = run.requests[i];
    const LoadRequest* q = i < requests.size() ? &requests[i] : nullptr;
    const bool ok = r.outcome == Outcome::kOk;
    Line j;
    j["arrival_s"] = r.send_s;
    if (q != nullptr && q->session.index >= 0) {  // a conversation's turn: the simulator's "session"
      j["session"] = q->session.index;
      j["session_id"] = q->session.id;
      j["turn"] = q->session.turn;
    }
    if (i < endpoints.size()) j["endpoint"] = endpoints[i];
    if (q != nullptr) {
      const std::string text = q->messages.empty() ? q->prompt : ConversationPrompt(q->messages);
      j["prompt_id"] = first.try_emplace({text, q->prompt_token_ids}, i).first->second;
    }
    j["prompt_tokens"] = r.prompt_tokens;
    if (q != nullptr && q->session.index >= 0) j["cached_tokens"] = r.cached_tokens;
    if (q != nullptr) j["prompt_text"] = q->prompt_token_ids.empty();
    j["output_tokens"] = r.output_tokens;
    j["ttft_ms"] = r.output_tokens > 0 ? Line(r.ttft_s * 1e3) : Line();
    j["e2e_ms"] = ok ? Line(r.e2e_s * 1e3) : Line();
    j["finish_s"] = ok ? Line(r.send_s + r.e2e_s) : Line();
    j["ok"] = ok;
    if (!ok) j["error"] = r.error.empty() ? (r.outcome == Outcome::kRejected ? "rejected" : "failed") : r.error;
    if (i < drafts.size() && r.output_tokens > 1 &&
        drafts[i].found.size() == static_cast<size_t>(r.output_tokens - 1)) {
      j["drafts_found"] = drafts[i].found;
      j["drafts_matched"] = drafts[i].matched;
    }
    out += j.dump() + "\n";
  }
  return out;
}

}  // namespace specula::experiments

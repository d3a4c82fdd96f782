#include "experiments/calibrate.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/stats.h"
#include "core/status_macros.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "experiments/calibrate_load.h"
#include "experiments/step_periods.h"
#include "serving/server.h"
#include "model/forward_cost.h"
#include "sim/cost_file.h"
#include "sim/step_time.h"

namespace specula::experiments {
namespace {

using json = nlohmann::json;

// Drafts that repeat the last token, k_ of them (0: none, a plain decode): verification runs its
// full work, one logits row per draft, whatever the target then accepts.
class RepeatProposer final : public Proposer {
 public:
  int32_t k_ = 0;
  absl::Status Propose(absl::Span<const ProposeInput> in, std::vector<Proposal>* out) override {
    out->assign(in.size(), Proposal{});
    for (size_t i = 0; i < in.size(); ++i) (*out)[i].tokens.assign(std::min(k_, in[i].k), in[i].tokens.back());
    return absl::OkStatus();
  }
};

struct Shape {
  int32_t batch = 1, context = 32;
};

// Sends `batch` requests of `context` random prompt tokens through the server, each consumed by a
// thread of its own as an in-process client (or a front end) consumes its stream, and waits for
// them. Once `stop` is set (the profile has its steps), the requests are cancelled.
void SendAndConsume(Server& server, Shape shape, int32_t vocab, int32_t max_tokens, uint32_t seed,
                    const std::atomic<bool>* stop = nullptr) {
  std::mt19937 rng(seed);
  std::vector<std::thread> clients;
  for (int32_t i = 0; i < shape.batch; ++i) {
    ServeRequest r;
    for (int32_t t = 0; t < shape.context; ++t) r.prompt_token_ids.push_back(3 + static_cast<TokenId>(rng() % (vocab - 3)));
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.seed = i;
    auto admitted = server.Submit(r);
    if (!admitted.ok()) continue;  // the engine's refusal shows as a shape without steps
    clients.emplace_back([&server, stop, stream = admitted->stream] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
      while (std::chrono::steady_clock::now() < deadline) {
        std::optional<RequestDelta> d = stream->Next(std::chrono::milliseconds(20));
        if (d && d->finished) break;
        if (!d && stop != nullptr && stop->load()) server.CancelAll();
      }
    });
  }
  for (std::thread& t : clients) t.join();
}

// One engine over `shape` behind the serving core (its loop thread, the streams and their
// consumers: the host work and contention a served step has): the shape's prefill steps, then
// timed steps (after one untimed) with each number of drafts in `ks` (0 first: plain decodes): at
// least o.decode_steps and o.min_phase_s, at most o.max_phase_steps or what the context holds. A
// step's time is its period as served (experiments/step_periods.h). Appends {seqs,
// tokens, rows, positions, seconds, kind, "phase": "grid"} per step.
absl::Status ProfileShape(LoadedEngine& e, SchedulerConfig sc, Shape shape, const std::vector<int32_t>& ks,
                          const CalibrateOptions& o, json* steps) {
  RepeatProposer proposer;
  SpecConfig spec;
  const int32_t k_max = *std::max_element(ks.begin(), ks.end());
  if (k_max > 0) spec.proposer = &proposer;
  sc.num_spec_tokens = k_max;
  sc.max_num_seqs = std::max(sc.max_num_seqs, shape.batch);
  sc.enable_prefix_caching = false;
  EngineVariant variant;
  variant.scheduler = sc;
  variant.spec = spec;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> made, MakeEngine(e, variant));
  Engine& engine = *made;
  const int32_t per_step = static_cast<int32_t>(ks.size()) * (k_max + 1);  // tokens a step of each phase adds
  const int32_t most = std::max(o.decode_steps, std::min(o.max_phase_steps, (sc.max_model_len - shape.context - 4) / per_step - 1));
  // On the loop's thread: each step's work and period, and the drafts' phases. `profiling` is set
  // between the warm-up and the profile, while the loop is idle.
  std::atomic<bool> profiling{false}, done{false};
  size_t phase = 0;
  int32_t in_phase = 0;
  double phase_start = 0;
  StepPeriods periods(
      [&](const StepPeriods::Step& s, double seconds) { steps->push_back(StepPeriods::Json(s, seconds, "grid")); });
  engine.set_step_observer([&](const StepPlan& p, const StepResult& result, double start_s) {
    if (!profiling || done) return;
    const StepWork w = RanWork(p, result);  // the drafts RepeatProposer gave
    const char* kind = StepKind(p, w);
    const bool prefill = kind == std::string_view("prefill");
    // Timed: every step but a phase's first decode (drafts from the step before it).
    const bool first_of_phase = !prefill && in_phase++ == 0;
    const double now = DefaultClock()->NowSeconds();
    periods.Add({w, kind, start_s, now, engine.HasUnfinished(), !first_of_phase});
    if (first_of_phase) phase_start = now;
    const bool enough = in_phase > o.decode_steps && (now - phase_start >= o.min_phase_s || in_phase > most);
    if (!prefill && enough) {
      if (phase + 1 == ks.size()) {
        done = true;  // the last phase has its steps: the rest of the requests is cancelled
      } else {
        proposer.k_ = ks[++phase];  // the next step drafts this many
        in_phase = 0;
      }
    }
  });
  ServeOptions so;
  so.model_name = "calibrate";
  Server server(&engine, e.tokenizer.get(), e.model->config(), so);
  const int32_t vocab = e.model->config().vocab_size;
  const uint32_t seed = static_cast<uint32_t>(shape.batch * 7919 + shape.context);
  // Once untimed with one output token (the engine's first steps touch its threads and the KV memory
  // the shape uses, which a serving engine has long touched), then the profile.
  SendAndConsume(server, shape, vocab, 1, seed);
  server.WaitIdle(std::chrono::milliseconds(60000));
  profiling = true;
  const int32_t max_tokens = per_step * (most + 1) + 2;
  SendAndConsume(server, shape, vocab, std::min(max_tokens, sc.max_model_len - shape.context - 1), seed + 1, &done);
  server.WaitIdle(std::chrono::milliseconds(60000));
  periods.Finish();
  return absl::OkStatus();
}

// Every shape of the grid that fits the model's context and the options' bound.
absl::StatusOr<json> ProfileModel(LoadedEngine& e, const CalibrateOptions& o, bool verify, int32_t* done, int32_t total) {
  ASSIGN_OR_RETURN(SchedulerConfig sc, BatchSchedulerConfig(e));
  std::vector<int32_t> ks = {0};
  if (verify) ks.insert(ks.end(), o.ks.begin(), o.ks.end());
  const int32_t k_max = *std::max_element(ks.begin(), ks.end());
  json steps = json::array();
  for (int32_t c : o.contexts) {
    for (int32_t b : o.batches) {
      const int32_t needed = c + static_cast<int32_t>(ks.size()) * (o.decode_steps + 1) * (k_max + 1) + 4;
      if (needed <= sc.max_model_len && int64_t{b} * c <= o.max_shape_tokens) {
        auto st = ProfileShape(e, sc, {b, c}, ks, o, &steps);
        if (!st.ok()) return absl::Status(st.code(), absl::StrCat("batch ", b, ", context ", c, ": ", st.message()));
      }
      if (o.progress) o.progress(++*done, total);
    }
  }
  // The forwards adaptive speculation measures at startup (its cost cache's table), so that a
  // simulated controller starts from the tables the engine's does.
  CostGrid grid{std::min(sc.max_num_seqs, 8), sc.block_size, 30.0, 512};
  ASSIGN_OR_RETURN(std::vector<CostPoint> forwards, MeasureForwardCost(*e.model, grid));
  json table = json::array();
  for (const CostPoint& p : forwards) table.push_back({{"tokens", p.tokens}, {"flops", p.flops}, {"seconds", p.seconds}});
  json out;
  out["tables"] = {{absl::StrCat("kv=", DTypeName(e.model->kv_dtype()), " batch=", grid.batch, " block=", grid.block_size), table}};
  out["shape"] = json::parse(ShapeJson(ShapeOf(e.model->config())));
  out["steps"] = steps;
  out["scheduler"] = {{"max_num_seqs", sc.max_num_seqs}, {"max_num_batched_tokens", sc.max_num_batched_tokens},
                      {"block_size", sc.block_size}, {"num_blocks", sc.num_blocks}, {"max_model_len", sc.max_model_len}};
  return out;
}

// The median decode step of the grid's batch nearest `batch` (by ratio): what sets a load's rate.
double DecodeSeconds(const json& steps, int32_t batch) {
  double best = INFINITY, seqs = 0;
  for (const json& s : steps) {
    const double d = std::abs(std::log(s["seqs"].get<double>() / batch));
    if (s["kind"] == "decode" && d < best) best = d, seqs = s["seqs"].get<double>();
  }
  std::vector<double> t;
  for (const json& s : steps) {
    if (s["kind"] == "decode" && s["seqs"].get<double>() == seqs) t.push_back(s["seconds"].get<double>());
  }
  if (t.empty()) return 0.01;
  return UpperMedian(std::move(t));
}

// The grid's median prefill time per prompt token.
double PrefillTokenSeconds(const json& steps) {
  std::vector<double> t;
  for (const json& s : steps) {
    const double prompt = s["tokens"].get<double>() - s["rows"].get<double>();
    if (s["kind"] == "prefill" && prompt > 0) t.push_back(s["seconds"].get<double>() / prompt);
  }
  if (t.empty()) return 0;
  return UpperMedian(std::move(t));
}

}  // namespace

absl::StatusOr<json> Calibrate(LoadedEngine& e, const CalibrateOptions& o) {
  const bool draft = e.options.speculation.method == "draft";
  const int32_t per_model = static_cast<int32_t>(o.contexts.size() * o.batches.size());
  int32_t done = 0;
  const int32_t total = per_model * (draft ? 2 : 1) + static_cast<int32_t>(o.load_concurrency.size());
  ASSIGN_OR_RETURN(json out, ProfileModel(e, o, true, &done, total));
  ASSIGN_OR_RETURN(SchedulerConfig sc, BatchSchedulerConfig(e));
  for (size_t i = 0; i < o.load_concurrency.size(); ++i) {
    LoadProfile lp;
    lp.concurrency = o.load_concurrency[i];
    lp.requests = o.load_requests;
    lp.max_prompt_len = *std::max_element(o.contexts.begin(), o.contexts.end());
    lp.decode_step_s = DecodeSeconds(out["steps"], lp.concurrency);
    lp.prefill_token_s = PrefillTokenSeconds(out["steps"]);
    lp.min_seconds = o.min_load_s;
    lp.seed = static_cast<uint32_t>(i + 1);
    auto st = ProfileLoad(e, sc, lp, &out["steps"]);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("served load at ", lp.concurrency, " in flight: ", st.message()));
    if (o.progress) o.progress(++done, total);
  }
  ASSIGN_OR_RETURN(const double overhead, MeasureRequestOverhead(e, sc));
  out["request_overhead_s"] = overhead;
  const double decode_s = DecodeSeconds(out["steps"], 2);
  ASSIGN_OR_RETURN(const double arrival, MeasureArrivalCost(e, sc, decode_s, true));
  ASSIGN_OR_RETURN(const double arrival_ids, MeasureArrivalCost(e, sc, decode_s, false));
  out["arrival_s"] = arrival;
  out["arrival_token_ids_s"] = arrival_ids;
  if (draft) {
    EngineOptions d = e.options;
    d.target.model = e.options.speculation.draft_model;
    if (!e.options.speculation.draft_tokenizer.empty()) d.target.tokenizer = e.options.speculation.draft_tokenizer;
    d.speculation = SpeculationOptions{};
    ASSIGN_OR_RETURN(std::unique_ptr<LoadedEngine> de, LoadEngine(d, nullptr));
    ASSIGN_OR_RETURN(json dj, ProfileModel(*de, o, false, &done, total));
    dj.erase("scheduler");
    out["draft"] = dj;
  }
  return out;
}

}  // namespace specula::experiments

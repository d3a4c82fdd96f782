#include "experiments/calibrate.h"

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "engine/engine.h"
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
// thread of its own as an in-process client (or a front end) consumes its stream, and waits for them.
void SendAndConsume(Server& server, Shape shape, int32_t vocab, int32_t max_tokens, uint32_t seed) {
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
    clients.emplace_back([stream = admitted->stream] {
      while (auto d = stream->Next(std::chrono::milliseconds(60000))) {
        if (d->finished) break;
      }
    });
  }
  for (std::thread& t : clients) t.join();
}

// One engine over `shape` behind the serving core (its loop thread, the streams and their
// consumers: the host work and contention a served step has): the shape's prefill steps, then
// decode_steps timed steps (after one untimed) with each number of drafts in `ks` (0 first: plain
// decodes). A step's time is the period from the previous step's end to its own, so that it holds
// everything between steps too. Appends {seqs, tokens, rows, positions, seconds, kind} per step.
absl::Status ProfileShape(LoadedEngine& e, SchedulerConfig sc, Shape shape, const std::vector<int32_t>& ks,
                          int32_t decode_steps, json* steps) {
  RepeatProposer proposer;
  SpecConfig spec;
  const int32_t k_max = *std::max_element(ks.begin(), ks.end());
  if (k_max > 0) spec.proposer = &proposer;
  sc.num_spec_tokens = k_max;
  sc.max_num_seqs = std::max(sc.max_num_seqs, shape.batch);
  sc.enable_prefix_caching = false;
  Engine engine(e.model.get(), e.tokenizer.get(), sc, spec);
  RETURN_IF_ERROR(engine.Validate());
  // On the loop's thread: each step's work and period, and the drafts' phases. `profiling` is set
  // between the warm-up and the profile, while the loop is idle.
  std::atomic<bool> profiling{false};
  double last = 0;  // the previous step's end (the engine's clock: the steady one)
  size_t phase = 0;
  int32_t in_phase = 0;
  engine.set_step_observer([&](const StepPlan& p, const StepResult& result, double start_s) {
    const double now = DefaultClock()->NowSeconds();
    std::vector<int32_t> drafts(p.seqs.size(), 0);  // what RepeatProposer gave: the result's num_drafts
    for (size_t i = 0, o = 0; i < p.seqs.size(); ++i) {
      if (p.seqs[i].samples && o < result.outputs.size()) drafts[i] = result.outputs[o++].num_drafts;
    }
    const StepWork w = PlanWork(p, drafts);
    const bool prefill = w.tokens > w.rows || std::any_of(p.seqs.begin(), p.seqs.end(), [](const ScheduledSeq& s) { return !s.samples; });
    const char* kind = prefill ? "prefill" : w.rows > w.seqs ? "verify" : "decode";
    // Timed: every step but a phase's first decode (drafts from the step before it); a step that
    // began after the loop idled is timed from its start, not from the step before.
    if (!profiling) return;
    const bool first_of_phase = !prefill && in_phase++ == 0;
    if (!first_of_phase) {
      steps->push_back({{"seqs", w.seqs}, {"tokens", w.tokens}, {"rows", w.rows}, {"positions", w.positions},
                        {"seconds", now - std::max(last, start_s)}, {"kind", kind}});
    }
    last = now;
    if (!prefill && in_phase > decode_steps && phase + 1 < ks.size()) {
      proposer.k_ = ks[++phase];  // the next step drafts this many
      in_phase = 0;
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
  const int32_t max_tokens = static_cast<int32_t>(ks.size()) * (decode_steps + 1) * (k_max + 1) + 2;
  SendAndConsume(server, shape, vocab, std::min(max_tokens, sc.max_model_len - shape.context - 1), seed + 1);
  server.WaitIdle(std::chrono::milliseconds(60000));
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
        auto st = ProfileShape(e, sc, {b, c}, ks, o.decode_steps, &steps);
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

}  // namespace

absl::StatusOr<json> Calibrate(LoadedEngine& e, const CalibrateOptions& o) {
  const bool draft = e.options.speculation.method == "draft";
  const int32_t per_model = static_cast<int32_t>(o.contexts.size() * o.batches.size());
  int32_t done = 0;
  const int32_t total = per_model * (draft ? 2 : 1);
  ASSIGN_OR_RETURN(json out, ProfileModel(e, o, true, &done, total));
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

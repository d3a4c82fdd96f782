#include "experiments/calibrate.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/engine.h"
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

// One engine over `shape`: its prefill's steps, then decode_steps timed steps (after one untimed)
// with each number of drafts in `ks` (0 first: plain decodes). Appends {seqs, tokens, rows,
// positions, seconds, kind} per timed step.
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
  std::mt19937 rng(static_cast<uint32_t>(shape.batch * 7919 + shape.context));
  const int32_t vocab = e.model->config().vocab_size;
  const int32_t total_steps = static_cast<int32_t>(ks.size()) * (decode_steps + 1);
  // The shape's prompts twice: once untimed with one output token (the engine's first steps touch
  // its threads and the KV memory the shape uses, which a serving engine has long touched), then
  // the profile.
  for (int pass = 0; pass < 2; ++pass) {
    for (int32_t i = 0; i < shape.batch; ++i) {
      Request r;
      r.id = pass * shape.batch + i;
      for (int32_t t = 0; t < shape.context; ++t) r.prompt.push_back(3 + static_cast<TokenId>(rng() % (vocab - 3)));
      r.max_tokens = pass == 0 ? 1 : total_steps * (k_max + 1) + 2;
      r.ignore_eos = true;
      RETURN_IF_ERROR(engine.AddRequest(std::move(r)));
    }
    if (pass == 0) {
      while (engine.HasUnfinished()) engine.Step();
    }
  }
  StepWork work;
  std::string kind;
  engine.set_step_observer([&](const StepPlan& p, const StepResult& result) {
    std::vector<int32_t> drafts(p.seqs.size(), 0);  // what RepeatProposer gave: the result's num_drafts
    for (size_t i = 0, o = 0; i < p.seqs.size(); ++i) {
      if (p.seqs[i].samples && o < result.outputs.size()) drafts[i] = result.outputs[o++].num_drafts;
    }
    work = PlanWork(p, drafts);
    const bool prefill = work.tokens > work.rows || std::any_of(p.seqs.begin(), p.seqs.end(), [](const ScheduledSeq& s) { return !s.samples; });
    kind = prefill ? "prefill" : work.rows > work.seqs ? "verify" : "decode";
  });
  auto step = [&](bool record) {
    const auto t0 = std::chrono::steady_clock::now();
    engine.Step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (record) {
      steps->push_back({{"seqs", work.seqs}, {"tokens", work.tokens}, {"rows", work.rows}, {"positions", work.positions},
                        {"seconds", s}, {"kind", kind}});
    }
  };
  while (engine.HasUnfinished() && kind != "decode" && kind != "verify") step(true);  // the prefill, chunk by chunk
  if (!steps->empty() && steps->back()["kind"] != "prefill") steps->erase(steps->size() - 1);  // its first decode: untimed
  for (int32_t k : ks) {
    proposer.k_ = k;
    step(false);
    for (int32_t i = 0; i < decode_steps && engine.HasUnfinished(); ++i) step(true);
  }
  for (int32_t i = 0; i < shape.batch; ++i) engine.Abort(shape.batch + i);
  while (engine.HasUnfinished()) engine.Step();
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
  json out;
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

#include "tools/sim_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sim/cost_file.h"

namespace specula {

const std::set<std::string> kSimFlags = {
    "cost", "shape", "device", "draft-shape", "weight-bytes", "kv-bytes", "spec-method", "num-spec-tokens",
    "acceptance", "acceptance-spread", "propose-us", "arrival-us", "max-num-seqs", "max-num-batched-tokens", "block-size",
    "num-blocks", "max-model-len", "max-queue-len", "max-queue-delay-ms", "ttft-slo-ms", "replicas", "routing",
    "request-rate", "burstiness", "burst-factor", "burst-start-s", "burst-duration-s", "num-prompts", "duration-s",
    "input-len", "output-len", "len-spread", "sessions", "prefix-reuse", "trace", "goodput", "seed"};
const std::set<std::string> kSimSwitches = {"roofline", "no-prefix-caching", "step-jitter"};

const char kSimFlagsHelp[] = R"(step times (one source; every output says which):
  --cost FILE           a calibration from `specula experiment calibrate` (measured whole steps on
                        this machine), or a step-cost cache file (then --shape too)
  --step-jitter         each step's time varies as the calibration's steps did around the fit (its
                        quantiles, mean kept); default: every step at the fit
  --device NAME --shape NAME   h100, h200, a100 or cpu-avx512-2core running a named shape
                        (llama-3.2-1b, llama-3.1-8b, llama-3.1-70b, qwen2.5-7b, smollm2-135m): the
                        GPU tables measured in docs/gpu.md where they exist, else the roofline
  --roofline            the roofline even where measured tables exist
  --weight-bytes B      bytes per weight for the roofline (default 2, bf16); --kv-bytes B (default 2)
speculation:
  --spec-method M       none (default), draft, ngram or suffix
  --num-spec-tokens K   k, or auto (default auto when a method is given)
  --draft-shape NAME    the draft model's shape on --device (a --cost file may carry the draft's steps)
  --acceptance A[,B..]  the acceptance of draft 1, 2, ... given those before were accepted (the last
                        repeats); required with speculation. Or `trace` with --spec-method ngram: each
                        request's drafts and acceptance replayed from the --trace's drafts_found
                        and drafts_matched (an experiment's trace of an n-gram point)
  --acceptance-spread C per-request variation: each request's level ~ Beta with concentration C
                        (default 0: none)
  --propose-us US       host time per drafting sequence of a proposer without a model (default 20)
replica:
  --max-num-seqs N (default 64)  --max-num-batched-tokens N (default 2048)  --block-size N (16)
  --num-blocks N        KV blocks (default: a --cost file's, else sized from the device's memory)
  --max-model-len N     (default 4096, or a --cost file's)   --no-prefix-caching
  --max-queue-len N  --max-queue-delay-ms MS  --ttft-slo-ms MS   admission control, as `serve`'s
  --arrival-us US       what a request's arrival adds to the step it lands in (default: a --cost
                        file's arrival_s for text prompts and arrival_token_ids_s for token ids,
                        else 0; with --validate too)
fleet:
  --replicas N (default 1)  --routing round_robin|least_outstanding|session (default least_outstanding)
workload (or --trace FILE: JSONL of arrival_s, prompt_tokens, output_tokens[, prompt_id][, session]
          [, prompt_text][, drafts_found, drafts_matched]; an experiment's traces/*.jsonl):
  --request-rate R      requests/s (default 10; inf: all at 0)   --burstiness B (gamma shape, 1 = Poisson)
  --burst-factor F --burst-start-s S --burst-duration-s D   a window at F times the rate
  --num-prompts N (default 1000) or --duration-s D (N = rate x D)
  --input-len N --output-len N (default 128 each)  --len-spread X (uniform within +-X of each)
  --sessions N --prefix-reuse X   request i is in session i % N, sharing X of its prompt with the last
  --goodput "ttft:MS tpot:MS e2el:MS"   SLOs for goodput   --seed N (default 0)
)";

namespace {

absl::Status Num(const Flags& f, const char* name, double* out, double lo, double hi = 1e300) {
  if (auto st = GetNumber(f, name, out); !st.ok()) return st;
  if (f.values.count(name) && !(*out >= lo && *out <= hi)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", f.values.at(name), " must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status Int(const Flags& f, const char* name, int32_t* out, int32_t lo) {
  if (auto st = GetNumber(f, name, out); !st.ok()) return st;
  if (f.values.count(name) && *out < lo) return absl::InvalidArgumentError(absl::StrCat("--", name, ": must be >= ", lo));
  return absl::OkStatus();
}

std::string Get(const Flags& f, const char* name, std::string fallback = "") {
  auto it = f.values.find(name);
  return it == f.values.end() ? fallback : it->second;
}

// The target's (and a draft's) step times; sizes the KV pool from the device's memory when
// nothing else says how many blocks there are.
absl::Status CostFromFlags(const Flags& f, SimSetup* s, std::optional<int32_t>* num_blocks) {
  const bool cost = f.values.count("cost") > 0, device = f.values.count("device") > 0;
  if (cost == device) {
    return absl::InvalidArgumentError("give the step times by --cost FILE, or by --device NAME --shape NAME");
  }
  std::optional<ForwardShape> shape;
  if (f.values.count("shape")) {
    auto sh = NamedForwardShape(Get(f, "shape"));
    if (!sh.ok()) return absl::InvalidArgumentError(absl::StrCat("--shape: ", sh.status().message()));
    shape = *sh;
  }
  ReplicaConfig& r = s->replica;
  if (cost) {
    auto file = LoadStepCostFile(Get(f, "cost"), shape);
    if (!file.ok()) return absl::Status(file.status().code(), absl::StrCat("--cost: ", file.status().message()));
    r.target_shape = file->target.shape;
    r.target = file->target.model;
    if (!f.switches.count("step-jitter")) r.target.SetJitter({});
    r.request_overhead_s = file->request_overhead_s;
    r.arrival_s = file->arrival_s;
    r.arrival_token_ids_s = file->arrival_token_ids_s;
    r.target_cost = file->target.forwards;
    if (file->draft) {
      r.draft_shape = file->draft->shape;
      r.draft = file->draft->model;
      r.draft_cost = file->draft->forwards;
    }
    if (file->scheduler) {
      r.scheduler.num_blocks = file->scheduler->num_blocks;
      r.scheduler.max_model_len = file->scheduler->max_model_len;
      *num_blocks = file->scheduler->num_blocks;
    }
    s->device = "cpu";
    s->cost_source = absl::StrCat("step times: ", CostOriginName(r.target.origin()), ", ", r.target.description());
    return absl::OkStatus();
  }
  if (!shape) return absl::InvalidArgumentError("--device needs --shape NAME");
  auto dev = NamedDevice(Get(f, "device"));
  if (!dev.ok()) return absl::InvalidArgumentError(absl::StrCat("--device: ", dev.status().message()));
  double wb = 2, kvb = 2;
  if (auto st = Num(f, "weight-bytes", &wb, 0.25, 8); !st.ok()) return st;
  if (auto st = Num(f, "kv-bytes", &kvb, 0.5, 8); !st.ok()) return st;
  s->device = dev->name;
  r.target_shape = *shape;
  auto measured = f.switches.count("roofline") ? absl::NotFoundError("") : MeasuredDeviceModel(dev->name, Get(f, "shape"));
  r.target = measured.ok() ? *measured : RooflineModel(*shape, wb, kvb, *dev);
  if (f.values.count("draft-shape")) {
    auto d = NamedForwardShape(Get(f, "draft-shape"));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--draft-shape: ", d.status().message()));
    r.draft_shape = *d;
    r.draft = RooflineModel(*d, wb, kvb, *dev);
  }
  // The pool: 90% of what the weights leave, in blocks of block_size positions of every layer's K and V.
  const double free = 0.9 * (dev->memory_bytes - ShapeParameters(*shape) * wb);
  const double block_bytes = 2.0 * shape->kv_dim * shape->num_layers * kvb * r.scheduler.block_size;
  if (free <= block_bytes) return absl::InvalidArgumentError(absl::StrCat("--shape ", Get(f, "shape"), " does not fit on ", dev->name));
  *num_blocks = static_cast<int32_t>(std::min(free / block_bytes, 4e6));
  s->cost_source = absl::StrCat("step times: ", CostOriginName(r.target.origin()), ", ", r.target.description());
  return absl::OkStatus();
}

absl::Status SpeculationFromFlags(const Flags& f, SimSetup* s) {
  const std::string method = Get(f, "spec-method", "none");
  if (method != "none" && method != "draft" && method != "ngram" && method != "suffix") {
    return absl::InvalidArgumentError(absl::StrCat("--spec-method: '", method, "' is not none, draft, ngram or suffix"));
  }
  ReplicaConfig& r = s->replica;
  if (method == "none") {
    if (f.values.count("num-spec-tokens") || f.values.count("acceptance")) {
      return absl::InvalidArgumentError("--num-spec-tokens and --acceptance need --spec-method");
    }
    // --validate takes each point's method from its results, and these two from here.
    if (!f.values.count("validate") && (f.values.count("acceptance-spread") || f.values.count("propose-us"))) {
      return absl::InvalidArgumentError("--acceptance-spread and --propose-us need --spec-method");
    }
    r.draft_shape.reset();
    return absl::OkStatus();
  }
  if (method == "draft" && !r.draft_shape) {
    return absl::InvalidArgumentError("--spec-method draft needs the draft's step times: --draft-shape, or a --cost file with a draft");
  }
  if (method != "draft") r.draft_shape.reset();
  const std::string k = Get(f, "num-spec-tokens", "auto");
  r.speculate = true;
  r.adaptive = k == "auto";
  r.scheduler.num_spec_tokens = 8;
  if (!r.adaptive && (!absl::SimpleAtoi(k, &r.scheduler.num_spec_tokens) || r.scheduler.num_spec_tokens < 1 ||
                      r.scheduler.num_spec_tokens > 16)) {
    return absl::InvalidArgumentError(absl::StrCat("--num-spec-tokens: '", k, "' is not auto or 1..16"));
  }
  if (!f.values.count("acceptance")) return absl::InvalidArgumentError("--spec-method needs --acceptance A[,B,...] or trace");
  s->acceptance_from_trace = Get(f, "acceptance") == "trace";
  if (s->acceptance_from_trace &&
      (method != "ngram" || !f.values.count("trace") || f.values.count("acceptance-spread"))) {
    return absl::InvalidArgumentError("--acceptance trace replays a --trace's n-gram drafts: it needs --spec-method ngram "
                                      "and --trace, and takes no --acceptance-spread");
  }
  std::vector<double> alpha = {0.0};  // with trace: what a request without a recorded profile accepts
  if (!s->acceptance_from_trace) {
    alpha.clear();
    for (absl::string_view v : absl::StrSplit(Get(f, "acceptance"), ',')) {
      double a;
      if (!absl::SimpleAtod(v, &a)) return absl::InvalidArgumentError(absl::StrCat("--acceptance: '", std::string(v), "' is not a number"));
      alpha.push_back(a);
    }
  }
  double spread = 0, propose_us = 20;
  if (auto st = Num(f, "acceptance-spread", &spread, 0); !st.ok()) return st;
  if (auto st = Num(f, "propose-us", &propose_us, 0); !st.ok()) return st;
  r.propose_seconds_per_seq = propose_us * 1e-6;
  auto acc = PositionalAcceptance::Create(alpha, spread);
  if (!acc.ok()) return absl::InvalidArgumentError(absl::StrCat("--", acc.status().message()));
  s->acceptance = std::make_unique<PositionalAcceptance>(*std::move(acc));
  s->spec_label = absl::StrCat(method, r.adaptive ? " auto" : absl::StrCat(" k=", k));
  return absl::OkStatus();
}

absl::Status WorkloadFromFlags(const Flags& f, SimSetup* s) {
  SyntheticWorkload& w = s->workload;
  ArrivalOptions& a = w.arrivals;
  a.request_rate = 10;
  if (Get(f, "request-rate") == "inf") {
    a.request_rate = std::numeric_limits<double>::infinity();
  } else if (auto st = Num(f, "request-rate", &a.request_rate, 1e-9); !st.ok()) {
    return st;
  }
  a.num_requests = 1000;
  double duration = 0;
  for (auto st : {Num(f, "burstiness", &a.burstiness, 1e-3), Num(f, "burst-factor", &a.burst_factor, 1e-3),
                  Num(f, "burst-start-s", &a.burst_start_s, 0), Num(f, "burst-duration-s", &a.burst_duration_s, 0),
                  Num(f, "duration-s", &duration, 0), Num(f, "len-spread", &w.len_spread, 0, 0.99),
                  Num(f, "prefix-reuse", &w.prefix_reuse, 0, 1), Int(f, "num-prompts", &a.num_requests, 1),
                  Int(f, "input-len", &w.prompt_len, 1), Int(f, "output-len", &w.output_len, 1),
                  Int(f, "sessions", &w.num_sessions, 0)}) {
    if (!st.ok()) return st;
  }
  if (f.values.count("duration-s")) {
    if (f.values.count("num-prompts")) return absl::InvalidArgumentError("give --num-prompts or --duration-s, not both");
    if (std::isinf(a.request_rate)) return absl::InvalidArgumentError("--duration-s needs a finite --request-rate");
    a.num_requests = std::max(1, static_cast<int32_t>(std::lround(a.request_rate * duration)));
  }
  if (a.burst_factor != 1 && (a.burst_duration_s <= 0 || std::isinf(a.request_rate))) {
    return absl::InvalidArgumentError("--burst-factor needs --burst-duration-s > 0 and a finite --request-rate");
  }
  int64_t seed = 0;
  if (auto st = GetNumber(f, "seed", &seed); !st.ok()) return st;
  s->seed = static_cast<uint64_t>(seed);
  a.seed = s->seed;
  if (f.values.count("trace")) s->trace = Get(f, "trace");
  if (f.values.count("goodput")) {
    auto slo = ParseGoodput(Get(f, "goodput"));
    if (!slo.ok()) return absl::InvalidArgumentError(absl::StrCat("--goodput: ", slo.status().message()));
    s->slo = *slo;
  }
  return absl::OkStatus();
}

absl::Status ReplicaFromFlags(const Flags& f, SimSetup* s, std::optional<int32_t> num_blocks) {
  SchedulerConfig& c = s->replica.scheduler;
  c.num_blocks = num_blocks.value_or(c.num_blocks);
  for (auto st : {Int(f, "max-num-seqs", &c.max_num_seqs, 1), Int(f, "max-num-batched-tokens", &c.max_num_batched_tokens, 1),
                  Int(f, "block-size", &c.block_size, 1), Int(f, "num-blocks", &c.num_blocks, 1),
                  Int(f, "max-model-len", &c.max_model_len, 1), Int(f, "replicas", &s->replicas, 1),
                  Int(f, "max-queue-len", &s->replica.admission.max_queue_len, 0),
                  Num(f, "max-queue-delay-ms", &s->replica.admission.max_queue_delay_ms, 0),
                  Num(f, "ttft-slo-ms", &s->replica.admission.ttft_slo_ms, 0)}) {
    if (!st.ok()) return st;
  }
  c.enable_prefix_caching = !f.switches.count("no-prefix-caching");
  if (f.values.count("arrival-us")) {
    double us = 0;
    if (auto st = Num(f, "arrival-us", &us, 0, 1e6); !st.ok()) return st;
    s->replica.arrival_s = s->replica.arrival_token_ids_s = us * 1e-6;
  }
  if (f.values.count("routing")) {
    auto r = ParseRouting(Get(f, "routing"));
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("--", r.status().message()));
    s->routing = *r;
  }
  if (auto st = ValidateSchedulerConfig(c); !st.ok()) return st;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimSetup> SimSetupFromFlags(const Flags& f) {
  SimSetup s;
  s.replica.scheduler.max_model_len = 4096;  // unless a --cost file says its engine's
  std::optional<int32_t> num_blocks;
  if (auto st = Int(f, "block-size", &s.replica.scheduler.block_size, 1); !st.ok()) return st;
  if (auto st = CostFromFlags(f, &s, &num_blocks); !st.ok()) return st;
  if (auto st = SpeculationFromFlags(f, &s); !st.ok()) return st;
  if (auto st = WorkloadFromFlags(f, &s); !st.ok()) return st;
  if (auto st = ReplicaFromFlags(f, &s, num_blocks); !st.ok()) return st;
  if (s.acceptance == nullptr) s.acceptance = std::make_unique<PositionalAcceptance>(*PositionalAcceptance::Create({0.0}));
  return s;
}

absl::StatusOr<std::vector<SimRequest>> SimRequests(const SimSetup& s) {
  if (!s.trace) return MakeRequests(s.workload);
  std::string note;
  auto t = LoadTrace(*s.trace, &note);
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat("--trace: ", t.status().message()));
  if (!note.empty()) std::fprintf(stderr, "[simulate] note: %s\n", note.c_str());
  const bool profiles = std::any_of(t->begin(), t->end(), [](const SimRequest& r) { return !r.drafts.found.empty(); });
  if (s.acceptance_from_trace && !profiles) {
    return absl::InvalidArgumentError(absl::StrCat("--acceptance trace: ", *s.trace, " has no drafts_found and drafts_matched "
                                                   "(an experiment's trace of an n-gram point has them)"));
  }
  if (!s.acceptance_from_trace && profiles && s.replica.speculate) {
    std::fprintf(stderr, "[simulate] note: the trace's drafts_found and drafts_matched are not replayed "
                         "(--acceptance trace replays them)\n");
  }
  return t;
}

}  // namespace specula

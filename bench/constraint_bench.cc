// What structured output costs on SmolLM2-135M-Instruct (Q4_1, from the model cache), on the CPU:
//
//  1. The mask in process: a valid JSON document of the schema, encoded with the model's tokenizer,
//     walked token by token through a ConstraintMatcher. At each position FillMask, then ApplyMask
//     on a logits row ([vocab]), then Accept the token; µs per row (mean, p50, p99) over every
//     position of every repetition, Accept timed apart (the engine follows the chosen tokens after
//     the step's mask).
//  2. Its share of an engine step: decode steps at batch 1 and 32, every request constrained by the
//     same schema or none (ignore_eos, so that none ends), sampled at temperature 0.7. The share is
//     EngineStats::constraint_mask_seconds over the steps' wall time (Accept, in the step's update,
//     is not in it); the ratio is a constrained run's median step over an unconstrained run's, the
//     two run back to back (which goes first alternates) a few times, reported as the median and
//     the spread. The issue's goal: the mask at most 5% of a step at batch 32.
//
//   build/release/bench/constraint_bench [--schema FILE [--instance FILE]] [--threads 2]
//       [--walks 20] [--steps 32] [--runs 5] [--model GGUF]
//
// Without --schema, a built-in order-lookup schema and a document of it. A --schema without an
// --instance walks the document the engine writes for it greedily. Plain timing rather than Google
// Benchmark: what is reported is percentiles of single rows and ratios of interleaved runs.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "constrain/constraint.h"
#include "core/flags.h"
#include "core/stats.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "engine/run.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

constexpr char kSchema[] = R"({
  "type": "object",
  "properties": {
    "order_id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
    "customer_name": {"type": "string"},
    "status": {"type": "string", "enum": ["pending", "processing", "shipped", "delivered", "cancelled"]},
    "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{3}$"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 10},
        "gift": {"type": "boolean"}}, "required": ["sku", "quantity", "gift"]}},
    "shipping": {"type": "object", "properties": {
        "city": {"type": "string"},
        "country": {"type": "string", "enum": ["US", "CA", "GB", "DE", "FR"]},
        "express": {"type": "boolean"}}, "required": ["city", "country", "express"]},
    "note": {"type": "string"}
  },
  "required": ["order_id", "customer_name", "status", "items", "shipping", "note"]
})";

// Properties in the schema's order, at most two blanks in a gap: as the grammar allows.
constexpr char kInstance[] =
    R"({"order_id": "AB-1234", "customer_name": "Jane Miller", "status": "shipped", "items": [)"
    R"({"sku": "BLN100", "quantity": 2, "gift": false}, {"sku": "TST230", "quantity": 1, "gift": true}], )"
    R"("shipping": {"city": "Springfield", "country": "US", "express": false}, )"
    R"("note": "Customer asked whether the toaster can still be added to the parcel before it leaves."})";

constexpr char kPrompts[][120] = {
    "Look up order AB-1234 for Jane Miller and answer with a JSON object.",
    "Where is order CD-5521 for Carlos Ortega? Reply in JSON.",
    "Give me the status of order QX-0042 (Aiko Tanaka) as JSON.",
    "Find order MN-7788 for Priya Nair; answer with the order as a JSON object.",
};

struct Options {
  std::string model = testing::SmolLm2Gguf();
  std::string schema_file, instance_file;
  int32_t threads = 2, walks = 20, steps = 32, runs = 5;
};

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  auto parsed =
      ParseFlags(argc - 1, argv + 1, {"model", "schema", "instance", "threads", "walks", "steps", "runs"}, {});
  if (!parsed.ok()) return parsed.status();
  Flags& f = *parsed;
  Options o;
  if (f.values.count("model")) o.model = f.values["model"];
  if (f.values.count("schema")) o.schema_file = f.values["schema"];
  if (f.values.count("instance")) o.instance_file = f.values["instance"];
  for (auto [name, out] : {std::pair{"threads", &o.threads}, std::pair{"walks", &o.walks},
                           std::pair{"steps", &o.steps}, std::pair{"runs", &o.runs}}) {
    if (absl::Status s = GetNumber(f, name, out); !s.ok()) return s;
    if (*out < 1) return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= 1"));
  }
  return o;
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The CPU's model name, its CPUs and the load average: the machine may be shared.
std::string MachineName() {
  std::ifstream in("/proc/cpuinfo");
  std::string name = "unknown";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      name = line.substr(line.find(':') + 2);
      break;
    }
  }
  double load[1] = {0};
  getloadavg(load, 1);
  char buf[64];
  std::snprintf(buf, sizeof buf, ", %d CPUs, load average %.1f", omp_get_num_procs(), load[0]);
  return name + buf;
}

std::string Today() {
  char buf[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", std::localtime(&now));
  return buf;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One table row: mean, p50, p99 and max of `us`.
std::string Row(const char* what, std::vector<double> us) {
  const Stats s = Summarize(us);
  std::sort(us.begin(), us.end());
  char buf[160];
  std::snprintf(buf, sizeof buf, "| %s | %.2f | %.2f | %.2f | %.2f |\n", what, s.mean, Percentile(us, 50),
                Percentile(us, 99), us.back());
  return buf;
}

// Part 1: each position of the document `walks` times (a fresh matcher each walk, after one walk
// that warms the caches), FillMask + ApplyMask timed per row and Accept apart.
bool TimeMaskRows(const Options& o, const std::string& schema, const std::string& document) {
  auto tokenizer = LoadGgufTokenizer(o.model);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s: %s\n", o.model.c_str(), std::string(tokenizer.status().message()).c_str());
    return false;
  }
  const int32_t vocab = (*tokenizer)->vocab_size();
  const std::vector<TokenId> stops = (*tokenizer)->eos_ids();
  auto compiler = ConstraintCompiler::Create(MakeConstraintVocab(**tokenizer, vocab, stops));
  const auto c0 = std::chrono::steady_clock::now();
  auto compiled = compiler->Compile({ConstraintSpec::Kind::kJsonSchema, schema, {}, "schema"});
  const double compile_ms = Seconds(c0, std::chrono::steady_clock::now()) * 1e3;
  if (!compiled.ok()) {
    std::fprintf(stderr, "%s\n", std::string(compiled.status().message()).c_str());
    return false;
  }
  std::vector<TokenId> tokens = (*tokenizer)->Encode(document, /*add_bos=*/false);
  tokens.push_back(stops.at(0));  // the stop token that ends the document
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(vocab), fresh(vocab);  // [vocab] each
  for (float& x : fresh) x = normal(rng);
  std::vector<uint32_t> mask(MaskWords(vocab));  // [MaskWords(vocab)]
  std::vector<double> fill_us, apply_us, row_us, accept_us;
  for (int32_t walk = 0; walk <= o.walks; ++walk) {
    ConstraintMatcher m(*compiled, stops);
    for (TokenId t : tokens) {
      std::copy(fresh.begin(), fresh.end(), logits.begin());
      const auto t0 = std::chrono::steady_clock::now();
      m.FillMask(absl::MakeSpan(mask));
      const auto t1 = std::chrono::steady_clock::now();
      ApplyMask(mask, absl::MakeSpan(logits));
      const auto t2 = std::chrono::steady_clock::now();
      const bool accepted = m.Accept(t);
      const auto t3 = std::chrono::steady_clock::now();
      if (!accepted) {
        std::fprintf(stderr, "the document leaves the schema's grammar at token %d (%s)\n", t,
                     (*tokenizer)->TokenBytes(t).c_str());
        return false;
      }
      if (walk == 0) continue;
      fill_us.push_back(Seconds(t0, t1) * 1e6);
      apply_us.push_back(Seconds(t1, t2) * 1e6);
      row_us.push_back(Seconds(t0, t2) * 1e6);
      accept_us.push_back(Seconds(t2, t3) * 1e6);
    }
    if (!m.terminated()) {
      std::fprintf(stderr, "the document does not complete the schema\n");
      return false;
    }
  }
  std::printf("## The mask in process\n\nvocabulary %d, schema compiled in %.1f ms, document %zu tokens + stop, "
              "%d walks (%zu rows)\n\n| per row | mean µs | p50 µs | p99 µs | max µs |\n|---|---|---|---|---|\n",
              vocab, compile_ms, tokens.size() - 1, o.walks, row_us.size());
  std::printf("%s%s%s%s\n", Row("FillMask", fill_us).c_str(), Row("ApplyMask", apply_us).c_str(),
              Row("**FillMask + ApplyMask**", row_us).c_str(), Row("Accept (apart)", accept_us).c_str());
  return true;
}

// One run's decode steps, all at the full batch.
struct DecodeRun {
  std::vector<double> step_s;  // [steps]: each step's wall time
  double mask_s = 0;           // constraint_mask_seconds over the steps
  int64_t rows = 0;            // constrained_rows over the steps
  double total_s() const { return std::accumulate(step_s.begin(), step_s.end(), 0.0); }
  double median_ms() const { return step_s.empty() ? 0 : UpperMedian(step_s) * 1e3; }
};

// `batch` requests, constrained by `spec` when it is given, then `steps` decode steps timed while
// every request runs; then the rest is aborted and drained.
DecodeRun RunDecode(Engine& engine, const Tokenizer& tok, const ConstraintSpec* spec, int32_t batch, int32_t steps,
                    uint64_t seed, RequestId* next_id) {
  std::vector<RequestId> ids;
  for (int32_t i = 0; i < batch; ++i) {
    Request r;
    r.id = (*next_id)++;
    r.prompt = tok.Encode(kPrompts[i % std::size(kPrompts)], /*add_bos=*/false);
    r.max_tokens = steps + 4;
    r.sampling.temperature = 0.7f;
    r.sampling.seed = seed + i;
    if (spec != nullptr) r.constraint = *spec;
    r.ignore_eos = spec == nullptr;
    ids.push_back(r.id);
    if (absl::Status s = engine.AddRequest(std::move(r)); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  }
  const int64_t generated = engine.stats().generated_tokens;
  while (engine.stats().generated_tokens - generated < batch) engine.Step();  // the prompts and first tokens
  DecodeRun run;
  for (int32_t s = 0; s < steps; ++s) {
    const EngineStats before = engine.stats();
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<RequestDelta> deltas = engine.Step();
    run.step_s.push_back(Seconds(t0, std::chrono::steady_clock::now()));
    run.mask_s += engine.stats().constraint_mask_seconds - before.constraint_mask_seconds;
    run.rows += engine.stats().constrained_rows - before.constrained_rows;
    // A request that ended makes the next step smaller than the batch measured.
    if (std::any_of(deltas.begin(), deltas.end(), [](const RequestDelta& d) { return d.finished; })) break;
  }
  for (RequestId id : ids) engine.Abort(id);
  while (engine.HasUnfinished()) engine.Step();
  return run;
}

// Part 2 at one batch size: `runs` pairs of an unconstrained and a constrained run, alternating
// which goes first. A pair's ratio compares the runs' median steps, which a step stretched by
// another process's burst on a shared machine moves little.
void TimeSteps(Engine& engine, const Tokenizer& tok, const ConstraintSpec& spec, const Options& o, int32_t batch,
               RequestId* next_id) {
  RunDecode(engine, tok, &spec, batch, 4, 0, next_id);  // warm-up: the compiler, the KV pool, the threads
  std::vector<double> ratios, shares, row_us, plain_ms, constrained_ms;
  int32_t full = 0;
  for (int32_t i = 0; i < o.runs; ++i) {
    DecodeRun plain, constrained;
    const uint64_t seed = 1000 * (i + 1);
    if (i % 2 == 0) plain = RunDecode(engine, tok, nullptr, batch, o.steps, seed, next_id);
    constrained = RunDecode(engine, tok, &spec, batch, o.steps, seed, next_id);
    if (i % 2 == 1) plain = RunDecode(engine, tok, nullptr, batch, o.steps, seed, next_id);
    if (static_cast<int32_t>(constrained.step_s.size()) == o.steps) ++full;
    ratios.push_back(constrained.median_ms() / plain.median_ms());
    shares.push_back(100 * constrained.mask_s / constrained.total_s());
    row_us.push_back(constrained.mask_s / std::max<int64_t>(1, constrained.rows) * 1e6);
    plain_ms.push_back(plain.median_ms());
    constrained_ms.push_back(constrained.median_ms());
  }
  std::sort(ratios.begin(), ratios.end());
  std::sort(shares.begin(), shares.end());
  std::printf("| %d | %.2f | %.2f | %.2f%% (%.2f-%.2f) | %.1f | %.3f (%.3f-%.3f) | %d/%d |\n", batch,
              UpperMedian(plain_ms), UpperMedian(constrained_ms), UpperMedian(shares), shares.front(), shares.back(),
              UpperMedian(row_us), UpperMedian(ratios), ratios.front(), ratios.back(), full, o.runs);
}

// The document the engine writes for the schema, greedily (when no --instance is given).
std::string GreedyDocument(Engine& engine, const Tokenizer& tok, const ConstraintSpec& spec) {
  Request r;
  r.id = 1;
  r.prompt = tok.Encode(kPrompts[0], /*add_bos=*/false);
  r.max_tokens = 1024;
  r.constraint = spec;
  if (absl::Status s = engine.AddRequest(std::move(r)); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
  auto out = RunToCompletion(engine);
  if (!out.ok() || out->empty() || (*out)[0].finish != FinishReason::kStopToken) {
    std::fprintf(stderr, "the greedy document did not end by its grammar within 1024 tokens\n");
    std::exit(1);
  }
  return (*out)[0].text;
}

std::unique_ptr<Engine> MakeBenchEngine(LoadedEngine& e, int32_t max_seqs) {
  SchedulerConfig sc;
  sc.block_size = 16;
  sc.max_model_len = 2048;
  sc.max_num_seqs = max_seqs;
  sc.max_num_batched_tokens = 2048;
  sc.num_blocks = max_seqs * 2048 / 16;
  auto engine = MakeEngine(e, EngineVariant{.scheduler = sc, .spec = SpecConfig{}});
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(engine);
}

int Main(int argc, char** argv) {
  absl::StatusOr<Options> o = ParseOptions(argc, argv);
  if (!o.ok()) {
    std::fprintf(stderr, "%s\n", std::string(o.status().message()).c_str());
    return 2;
  }
  omp_set_num_threads(o->threads);
  EngineOptions options;
  options.target.model = o->model;
  auto loaded = LoadEngine(options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s: %s (run scripts/fetch_models.sh)\n", o->model.c_str(),
                 std::string(loaded.status().message()).c_str());
    return 1;
  }
  LoadedEngine& e = **loaded;
  const std::string schema = o->schema_file.empty() ? kSchema : ReadFileOrDie(o->schema_file);
  const ConstraintSpec spec{ConstraintSpec::Kind::kJsonSchema, schema, {}, "schema"};
  std::unique_ptr<Engine> engine = MakeBenchEngine(e, 32);
  std::string document = kInstance;
  if (!o->instance_file.empty()) document = ReadFileOrDie(o->instance_file);
  if (!o->schema_file.empty() && o->instance_file.empty()) document = GreedyDocument(*engine, *e.tokenizer, spec);
  std::printf("machine: %s; date: %s; %d threads; model %s; schema %s\n\n", MachineName().c_str(), Today().c_str(),
              o->threads, o->model.c_str(),
              o->schema_file.empty() ? "built-in (order lookup)" : o->schema_file.c_str());
  std::printf("document: %s\n\n", document.c_str());
  if (!TimeMaskRows(*o, schema, document)) return 1;
  std::printf("## The mask's share of a decode step\n\n%d decode steps a run, %d interleaved runs of each; "
              "median over runs (min-max)\n\n| batch | median step ms, none constrained | median step ms, all "
              "constrained | mask / step | mask µs per row | constrained / unconstrained median step | runs at full "
              "batch |\n"
              "|---|---|---|---|---|---|---|\n",
              o->steps, o->runs);
  RequestId next_id = 100;
  for (int32_t batch : {1, 32}) TimeSteps(*engine, *e.tokenizer, spec, *o, batch, &next_id);
  return 0;
}

}  // namespace
}  // namespace specula

int main(int argc, char** argv) { return specula::Main(argc, argv); }

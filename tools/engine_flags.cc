#include "tools/engine_flags.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "spec/cost_cache.h"

namespace specula {

const std::set<std::string> kEngineFlags = {
    "model", "tokenizer", "max-num-seqs", "max-num-batched-tokens", "num-blocks", "max-wait-ms", "max-tokens",
    "spec-method", "num-spec-tokens", "max-spec-tokens", "draft-model", "draft-tokenizer", "ngram-min",
    "ngram-max", "temperature", "top-k", "top-p", "min-p", "repetition-penalty", "seed", "block-size",
    "device", "dtype", "gpu-memory-utilization", "quantization", "draft-quantization", "kv-cache-dtype",
    "draft-layers", "draft-quant-type", "tensor-parallel-size", "collective-timeout-s", "suffix-max-depth",
    "suffix-cache-tokens", "suffix-min-prob", "cost-cache", "grammar-drafts"};
const std::set<std::string> kEngineSwitches = {"ignore-eos", "no-bos", "no-prefix-caching", "int8-activations",
                                               "two-term-activations"};

const char kEngineFlagsHelp[] = R"(  --model PATH          GGUF file (llama, mistral, qwen2; F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K,
                        its tokenizer and chat template inside), llama2.c .bin file, or HF
                        directory (config.json + *.safetensors)
  --tokenizer PATH      tokenizer.bin, tokenizer.json, a .gguf file or a directory holding
                        tokenizer.json (default: the GGUF file's own, tokenizer.json in the model
                        directory, or tokenizer.bin / tok<vocab>.bin beside a .bin model)
  --max-tokens N        tokens to generate (default 256)
  --temperature T       0 = greedy (default 0)
  --top-k K             keep the K most likely tokens (default 0 = off)
  --top-p P             nucleus sampling mass (default 1 = off)
  --min-p P             drop tokens below P x the top probability (default 0 = off)
  --repetition-penalty R  HF-style penalty on seen tokens (default 1 = off)
  --seed S              random seed (default 0)
  --block-size B        KV cache block size in tokens (default 16)
  --device D            cpu (the reference, f32) or cuda (one GPU; needs a CUDA build) (default cpu)
  --dtype D             compute dtype: f32 on cpu; bf16 (default), f16 or f32 on cuda
  --gpu-memory-utilization F  share of GPU memory the process may use; the KV pool takes what the
                        weights and activations leave (default 0.9; cuda only)
  --quantization Q      none (default) or int8: weight matrices stored as int8 with a scale per row
                        (a quarter of f32's bytes; cpu only). Changes the target's output slightly
  --two-term-activations  GGUF quantized weights multiply activations rounded to two 8-bit terms
                        per group of 32: within ~1e-4 of float32, at twice the integer work (a
                        5-token step 1.5x slower, prefill 1.9x). Default (--int8-activations): one
                        term, as llama.cpp does, whose logits differ from float32's by ~1% (cpu)
  --kv-cache-dtype D    element type of the KV cache: f32 or bf16 (default on cpu: bf16, which halves
                        the bytes attention reads; on cuda: the compute dtype, the only one offered)
  --tensor-parallel-size N  shard the target over N ranks (Megatron style: heads, hidden units and
                        vocabulary), one process each, launched with `mpirun -np N specula ...`
                        (default 1). Rank 0 schedules, drafts, samples and verifies; the others
                        run their share of each forward. See README, "Tensor parallelism"
  --collective-timeout-s S  how long a rank waits in a collective before failing with an error
                        naming it (default 60); a rank that dies fails the others at once
  --ignore-eos          keep generating past end-of-sequence tokens
  --no-bos              do not prepend BOS to the prompt

Continuous batching over a paged KV cache (generate --prompts-file, serve):
  --max-num-seqs N      sequences per step (default 64)
  --max-num-batched-tokens T  tokens per step, prefill chunks included (default 2048)
  --num-blocks K        KV pool size in blocks (default on cpu: max-num-seqs full contexts, capped
                        at 4 GiB; on cuda: sized from --gpu-memory-utilization)
  --max-wait-ms MS      batching window: how long new arrivals wait for company (default 0)
  --no-prefix-caching   turn automatic prefix caching off

Speculative decoding (single prompt and batch; output is exactly what the target alone gives when
greedy, and follows the target's distribution when sampling):
  --spec-method M       draft (a smaller model), ngram (prompt lookup), suffix (suffix decoding:
                        the longest match in the request and recent outputs), or a draft made of
                        the target itself: layer-skip (its first --draft-layers layers, final norm
                        and classifier) or self-quant (its weights requantized to --draft-quant-type)
  --num-spec-tokens K   draft tokens per sequence and step, or auto (default 4). auto chooses k for
                        every sequence and step, 0 included, for the most expected tokens per second
                        from each request's acceptance and a cost model of the target and the draft
                        (measured at startup in at most 1 s each, then refined from the engine's own
                        step times): speculation where it pays, none where it would slow the batch
  --max-spec-tokens K   the largest k auto may choose (default 8)
  --cost-cache DIR      where auto keeps the step costs it measured, per model, machine and build, so
                        that the next run starts with them (default ~/.cache/specula/step-cost, or
                        $SPECULA_COST_CACHE); none: measure in every run
  --draft-model PATH    the draft model for --spec-method draft (llama2.c .bin or HF directory)
  --draft-tokenizer PATH  the draft's tokenizer, checked against the target's (default: shared)
  --draft-quantization Q  none (default) or int8 for the draft's weights (cpu only): a draft a
                        quarter the bytes, at a small cost in acceptance and none in correctness
  --ngram-min N, --ngram-max N  n-gram sizes for --spec-method ngram (default 2 and 4: a one-token
                        match proposes too often on chat, docs/suffix.md)
  --suffix-max-depth N  --spec-method suffix: longest context matched, in tokens (default 64)
  --suffix-cache-tokens N  tokens of finished requests kept for suffix drafts, least recently used
                        evicted first (default 1048576, 16 bytes each; 0: the request's own only)
  --suffix-min-prob P   stop a suffix draft once its path probability is below P (default 0.1)
  --draft-layers N      layers of the layer-skip draft (default: a quarter of the target's)
  --draft-quant-type T  q4_0 (default), q4_1 or q8_0: the self-quant draft's weight type
  --grammar-drafts N    structured output: where a request's grammar allows one continuation (a JSON
                        key, a closing brace) and the proposer has no draft, up to N of its tokens are
                        drafts, with any --spec-method, none included (default 8; 0: off)
)";

const char kRequestTableHelp[] = R"(
Requests' defaults and bounds, by the surface they come from (docs/architecture.md, "The request
boundary"); "the room" is the context's length less the prompt's tokens:

)";

namespace {

// The flag's value if given, else `fallback`.
std::string Value(const Flags& f, const std::string& name, const std::string& fallback) {
  auto it = f.values.find(name);
  return it == f.values.end() ? fallback : it->second;
}

absl::Status ReadTarget(const Flags& f, TargetOptions* t) {
  t->model = Value(f, "model", "");
  t->tokenizer = Value(f, "tokenizer", "");
  t->device = Value(f, "device", t->device);
  t->dtype = Value(f, "dtype", "");
  t->quantization = Value(f, "quantization", t->quantization);
  if (f.switches.count("int8-activations") && f.switches.count("two-term-activations")) {
    return absl::InvalidArgumentError("--int8-activations and --two-term-activations exclude each other");
  }
  t->int8_activations = f.switches.count("two-term-activations") == 0;
  t->kv_cache_dtype = Value(f, "kv-cache-dtype", "");
  for (auto st : {GetNumber(f, "tensor-parallel-size", &t->tensor_parallel_size),
                  GetNumber(f, "collective-timeout-s", &t->collective_timeout_s),
                  GetNumber(f, "gpu-memory-utilization", &t->gpu_memory_utilization)}) {
    RETURN_IF_ERROR(st);
  }
  return absl::OkStatus();
}

absl::Status ReadSpeculation(const Flags& f, SpeculationOptions* s) {
  s->method = Value(f, "spec-method", "none");
  s->adaptive = Value(f, "num-spec-tokens", "") == "auto";
  // Flags of one method or mode only.
  for (const auto& [flag, method] : {std::pair<std::string, std::string>{"draft-layers", "layer-skip"},
                                     {"draft-quant-type", "self-quant"}, {"suffix-max-depth", "suffix"},
                                     {"suffix-cache-tokens", "suffix"}, {"suffix-min-prob", "suffix"}}) {
    if (f.values.count(flag) && s->method != method) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " applies to --spec-method ", method));
    }
  }
  if (f.values.count("max-spec-tokens") && !s->adaptive) {
    return absl::InvalidArgumentError("--max-spec-tokens applies to --num-spec-tokens auto only");
  }
  s->num_spec_tokens = s->adaptive ? 8 : 4;
  for (auto st : {GetNumber(f, s->adaptive ? "max-spec-tokens" : "num-spec-tokens", &s->num_spec_tokens),
                  GetNumber(f, "ngram-min", &s->ngram_min), GetNumber(f, "ngram-max", &s->ngram_max),
                  GetNumber(f, "draft-layers", &s->draft_layers), GetNumber(f, "suffix-max-depth", &s->suffix_max_depth),
                  GetNumber(f, "suffix-cache-tokens", &s->suffix_cache_tokens),
                  GetNumber(f, "suffix-min-prob", &s->suffix_min_prob),
                  GetNumber(f, "grammar-drafts", &s->grammar_drafts)}) {
    RETURN_IF_ERROR(st);
  }
  if (f.values.count("draft-layers") && s->draft_layers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-layers must be positive, got ", s->draft_layers));
  }
  s->draft_model = Value(f, "draft-model", "");
  s->draft_tokenizer = Value(f, "draft-tokenizer", "");
  s->draft_quantization = Value(f, "draft-quantization", s->draft_quantization);
  s->draft_quant_type = Value(f, "draft-quant-type", s->draft_quant_type);
  if (f.values.count("cost-cache") && !s->adaptive) {
    return absl::InvalidArgumentError("--cost-cache applies to --num-spec-tokens auto only");
  }
  s->cost_cache = Value(f, "cost-cache", DefaultCostCacheDir());
  if (s->cost_cache.empty()) return absl::InvalidArgumentError("--cost-cache: give a directory, or none");
  return absl::OkStatus();
}

absl::Status ReadDefaults(const Flags& f, RequestDefaults* d) {
  int64_t seed = 0;
  for (auto st : {GetNumber(f, "max-tokens", &d->max_tokens), GetNumber(f, "temperature", &d->sampling.temperature),
                  GetNumber(f, "top-k", &d->sampling.top_k), GetNumber(f, "top-p", &d->sampling.top_p),
                  GetNumber(f, "min-p", &d->sampling.min_p),
                  GetNumber(f, "repetition-penalty", &d->sampling.repetition_penalty), GetNumber(f, "seed", &seed),
                  GetNumber(f, "block-size", &d->block_size)}) {
    RETURN_IF_ERROR(st);
  }
  d->sampling.seed = static_cast<uint64_t>(seed);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EngineOptions> EngineOptionsFromFlags(const Flags& f) {
  EngineOptions o;
  RETURN_IF_ERROR(ReadTarget(f, &o.target));
  RETURN_IF_ERROR(ReadSpeculation(f, &o.speculation));
  RETURN_IF_ERROR(ReadDefaults(f, &o.defaults));
  BatchingOptions& b = o.batching;
  for (auto st : {GetNumber(f, "max-num-seqs", &b.max_num_seqs),
                  GetNumber(f, "max-num-batched-tokens", &b.max_num_batched_tokens),
                  GetNumber(f, "num-blocks", &b.num_blocks), GetNumber(f, "max-wait-ms", &b.max_wait_ms)}) {
    RETURN_IF_ERROR(st);
  }
  b.enable_prefix_caching = !f.switches.count("no-prefix-caching");
  o.add_bos = !f.switches.count("no-bos");
  o.ignore_eos = f.switches.count("ignore-eos") > 0;
  RETURN_IF_ERROR(ValidateEngineOptions(o));
  return o;
}

}  // namespace specula

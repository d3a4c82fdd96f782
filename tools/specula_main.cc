// specula: the command-line front end. Subcommands, like git:
//   specula generate    --model PATH --prompt TEXT ...
//   specula make-model  --shape NAME|--config config.json --out DIR ...
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/mapped_file.h"
#include "draft/draft_model_proposer.h"
#include "draft/ngram_proposer.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "model/make_model.h"
#include "model/tokenizer.h"
#include "tools/batch_generate.h"
#include "tools/flags.h"
#include "kernels/make_backend.h"

namespace specula {
namespace {

constexpr char kUsage[] = R"(specula: a speculative-decoding research and serving engine

usage: specula <command> [flags]

commands:
  generate     generate text from a model
  make-model   write a random-weight HF model of a named real shape
  help         show this message

Run 'specula <command> --help' for a command's flags.
)";

constexpr char kGenerateUsage[] = R"(usage: specula generate --model PATH --prompt TEXT [flags]

Writes only the new text to stdout, as it is produced. Statistics go to stderr.

  --model PATH          llama2.c .bin file, or HF directory (config.json + *.safetensors)
  --tokenizer PATH      tokenizer.bin, tokenizer.json or a directory holding it
                        (default: tokenizer.json in the model directory, or tokenizer.bin /
                        tok<vocab>.bin beside a .bin model)
  --prompt TEXT         the prompt
  --prompt-file PATH    read the prompt from a file instead
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
  --kv-cache-dtype D    element type of the KV cache: f32 or bf16 (default on cpu: bf16, which halves
                        the bytes attention reads; on cuda: the compute dtype, the only one offered)
  --ignore-eos          keep generating past end-of-sequence tokens
  --no-bos              do not prepend BOS to the prompt

Batch mode (continuous batching over a paged KV cache):
  --prompts-file PATH   JSON lines {"id":..., "prompt":..., "max_tokens":..., "temperature":...}
                        (optional: top_p, top_k, min_p, repetition_penalty, seed, stop). Writes one
                        JSON line per request: id, text, token_ids, finish_reason, ttft_ms, tpot_ms.
                        A malformed line gets an error naming its line and field; the others run.
  --max-num-seqs N      sequences per step (default 64)
  --max-num-batched-tokens T  tokens per step, prefill chunks included (default 2048)
  --num-blocks K        KV pool size in blocks (default on cpu: max-num-seqs full contexts, capped
                        at 4 GiB; on cuda: sized from --gpu-memory-utilization)
  --max-wait-ms MS      batching window: how long new arrivals wait for company (default 0)
  --no-prefix-caching   turn automatic prefix caching off
  --no-progress         no progress bar on stderr

Speculative decoding (single prompt and batch; output is exactly what the target alone gives when
greedy, and follows the target's distribution when sampling):
  --spec-method M       draft (a smaller model) or ngram (prompt lookup)
  --num-spec-tokens K   draft tokens per sequence and step, or auto (default 4). auto chooses k for
                        every sequence and step, 0 included, for the most expected tokens per second
                        from each request's acceptance and a cost model of the target and the draft
                        (measured at startup in at most 1 s each, then refined from the engine's own
                        step times): speculation where it pays, none where it would slow the batch
  --max-spec-tokens K   the largest k auto may choose (default 8)
  --draft-model PATH    the draft model for --spec-method draft (llama2.c .bin or HF directory)
  --draft-tokenizer PATH  the draft's tokenizer, checked against the target's (default: shared)
  --draft-quantization Q  none (default) or int8 for the draft's weights (cpu only): a draft a
                        quarter the bytes, at a small cost in acceptance and none in correctness
  --ngram-min N, --ngram-max N  n-gram sizes for --spec-method ngram (default 1 and 3)
)";

constexpr char kMakeModelUsage[] = R"(usage: specula make-model (--shape NAME | --config config.json) --out DIR [flags]

Writes an HF directory (config.json, model.safetensors, tokenizer.json) with random weights of a
real model's shape, for speed work without downloads.

  --shape NAME     one of: %s
  --config PATH    an HF config.json to take the shape from instead
  --out DIR        output directory (created if missing)
  --vocab N        override the vocabulary size
  --dtype D        f32, f16 or bf16 (default f32)
  --seed S         random seed (default 0)
)";

// The CPU's KV cache dtype when --kv-cache-dtype is not given (README, "KV cache dtype").
constexpr DType kDefaultCpuKvDtype = DType::kBF16;

bool Exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

std::string DefaultTokenizer(const std::string& model, int32_t vocab) {
  if (Exists(model + "/tokenizer.json")) return model + "/tokenizer.json";
  const size_t slash = model.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : model.substr(0, slash);
  for (const std::string& name : {std::string("tokenizer.bin"), absl::StrCat("tok", vocab, ".bin")}) {
    if (Exists(dir + "/" + name)) return dir + "/" + name;
  }
  return "";
}

// One prompt through the engine with speculation, streaming each step's new text.
absl::Status RunSpeculativeSingle(LlamaModel& model, const Tokenizer& tok, const std::vector<TokenId>& prompt,
                                  const GenerateOptions& opt, Proposer* proposer, int32_t num_spec, bool adaptive) {
  SchedulerConfig sc;
  sc.max_num_seqs = 1;
  sc.block_size = opt.block_size;
  sc.max_model_len = model.config().max_seq_len;
  sc.num_blocks = (sc.max_model_len + sc.block_size - 1) / sc.block_size + 1;
  sc.max_num_batched_tokens = std::max(2048, num_spec + 1);
  sc.num_spec_tokens = num_spec;
  SpecConfig spec;
  spec.proposer = proposer;
  spec.adaptive = adaptive;
  Engine engine(&model, &tok, sc, spec);
  if (auto st = engine.Validate(); !st.ok()) return st;
  Request r;
  r.id = 0;
  r.prompt = prompt;
  r.max_tokens = std::max(1, std::min<int32_t>(opt.max_tokens, sc.max_model_len - static_cast<int32_t>(prompt.size())));
  r.sampling = opt.sampling;
  r.stop_ids = opt.stop_ids;
  r.ignore_eos = true;  // stop ids are explicit here
  if (auto st = engine.AddRequest(r); !st.ok()) return st;
  size_t printed = 0;
  RequestOutput final_out;
  while (engine.HasUnfinished()) {
    for (auto& o : engine.Step()) final_out = std::move(o);
    if (const RequestOutput* p = engine.Peek(0); p != nullptr && p->text.size() > printed) {
      std::fwrite(p->text.data() + printed, 1, p->text.size() - printed, stdout);
      std::fflush(stdout);
      printed = p->text.size();
    }
  }
  if (final_out.text.size() > printed) std::fwrite(final_out.text.data() + printed, 1, final_out.text.size() - printed, stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double decode_ms = final_out.token_ms.empty() ? 0 : final_out.finish_ms - final_out.first_token_ms;
  std::fprintf(stderr, "[specula] prompt tokens: %d, generated tokens: %zu\n[specula] ttft: %.1f ms, decode: %.1f tokens/s\n",
               final_out.prompt_tokens, final_out.tokens.size(), final_out.ttft_ms(),
               final_out.tokens.size() > 1 ? (final_out.tokens.size() - 1) / (decode_ms / 1000) : 0.0);
  std::fputs(SpecStatsLine(final_out.spec).c_str(), stderr);
  std::fputs(SpecLengthLine(engine.stats()).c_str(), stderr);
  return absl::OkStatus();
}

absl::Status RunGenerate(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv,
                          {"model", "tokenizer", "prompt", "prompt-file", "prompts-file", "max-num-seqs",
                           "max-num-batched-tokens", "num-blocks", "max-wait-ms", "max-tokens",
                           "spec-method", "num-spec-tokens", "max-spec-tokens", "draft-model", "draft-tokenizer", "ngram-min", "ngram-max", "temperature", "top-k",
                           "top-p", "min-p", "repetition-penalty", "seed", "block-size", "device", "dtype",
                           "gpu-memory-utilization", "quantization", "draft-quantization", "kv-cache-dtype"},
                          {"help", "ignore-eos", "no-bos", "no-prefix-caching", "no-progress"});
  if (!flags.ok()) return flags.status();
  if (flags->switches.count("help")) {
    std::cout << kGenerateUsage;
    return absl::OkStatus();
  }
  if (!flags->values.count("model")) return absl::InvalidArgumentError("--model is required");
  if (flags->values.count("prompt") + flags->values.count("prompt-file") + flags->values.count("prompts-file") != 1) {
    return absl::InvalidArgumentError("give exactly one of --prompt TEXT, --prompt-file PATH or --prompts-file PATH");
  }
  if (flags->values.count("prompt-file")) {
    auto text = ReadTextFile(flags->values["prompt-file"]);
    if (!text.ok()) return text.status();
    flags->values["prompt"] = *text;
  }
  GenerateOptions opt;
  opt.max_tokens = 256;
  int64_t seed = 0;
  for (auto st : {GetNumber(*flags, "max-tokens", &opt.max_tokens),
                  GetNumber(*flags, "temperature", &opt.sampling.temperature),
                  GetNumber(*flags, "top-k", &opt.sampling.top_k),
                  GetNumber(*flags, "top-p", &opt.sampling.top_p),
                  GetNumber(*flags, "min-p", &opt.sampling.min_p),
                  GetNumber(*flags, "repetition-penalty", &opt.sampling.repetition_penalty),
                  GetNumber(*flags, "seed", &seed), GetNumber(*flags, "block-size", &opt.block_size)}) {
    if (!st.ok()) return st;
  }
  opt.sampling.seed = static_cast<uint64_t>(seed);
  if (opt.block_size <= 0) return absl::InvalidArgumentError("--block-size must be positive");
  if (auto st = ValidateSamplingParams(opt.sampling); !st.ok()) return st;

  const std::string model_path = flags->values["model"];
  auto weights = LoadModel(model_path);
  if (!weights.ok()) return weights.status();
  const int32_t vocab = (*weights)->config.vocab_size;
  std::string tok_path = flags->values.count("tokenizer") ? flags->values["tokenizer"]
                                                           : DefaultTokenizer(model_path, vocab);
  if (tok_path.empty()) {
    return absl::NotFoundError(absl::StrCat("no tokenizer found beside ", model_path, "; pass --tokenizer PATH"));
  }
  auto tokenizer = LoadTokenizer(tok_path, vocab);
  if (!tokenizer.ok()) return tokenizer.status();
  const Tokenizer& tok = **tokenizer;
  if (tok.vocab_size() > vocab) {
    return absl::InvalidArgumentError(absl::StrCat(tok_path, ": tokenizer has ", tok.vocab_size(),
                                                   " tokens but the model's vocab_size is ", vocab));
  }
  BackendSpec backend_spec;
  if (flags->values.count("device")) backend_spec.device = flags->values["device"];
  if (flags->values.count("dtype")) backend_spec.dtype = flags->values["dtype"];
  BackendSpec draft_spec = backend_spec;
  if (flags->values.count("quantization")) backend_spec.quantization = flags->values["quantization"];
  if (flags->values.count("draft-quantization")) draft_spec.quantization = flags->values["draft-quantization"];
  // Checked before any model loads, so that a bad --draft-quantization fails fast.
  for (auto st : {CheckQuantization("--quantization", backend_spec.quantization, backend_spec.device),
                  CheckQuantization("--draft-quantization", draft_spec.quantization, draft_spec.device)}) {
    if (!st.ok()) return st;
  }
  double gpu_util = 0.9;
  if (auto st = GetNumber(*flags, "gpu-memory-utilization", &gpu_util); !st.ok()) return st;
  if (!(gpu_util > 0.0 && gpu_util <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-memory-utilization must be in (0, 1], got ", gpu_util));
  }
  auto target_backend = MakeBackend(backend_spec);
  if (!target_backend.ok()) return target_backend.status();
  auto model_or = LlamaModel::Create(std::move(weights).value(), std::move(target_backend).value());
  if (!model_or.ok()) return model_or.status();
  LlamaModel& model = **model_or;
  // The KV cache dtype of the target and the draft: bf16 on the CPU unless asked otherwise (see
  // --help), the compute dtype on a GPU.
  std::optional<DType> kv_dtype;
  if (flags->values.count("kv-cache-dtype")) {
    const std::string d = flags->values["kv-cache-dtype"];
    if (d != "f32" && d != "bf16") {
      return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype: '", d, "' is not f32 or bf16"));
    }
    kv_dtype = *ParseDType(d);
  } else if (!model.backend().on_device()) {
    kv_dtype = kDefaultCpuKvDtype;
  }
  if (kv_dtype.has_value()) {
    if (auto st = model.set_kv_dtype(*kv_dtype); !st.ok()) return st;
  }

  // Speculative decoding.
  std::unique_ptr<LlamaModel> draft_model;
  std::unique_ptr<Proposer> proposer;
  int32_t num_spec = 0;
  const bool adaptive = flags->values.count("num-spec-tokens") && flags->values["num-spec-tokens"] == "auto";
  if (flags->values.count("max-spec-tokens") && !adaptive) {
    return absl::InvalidArgumentError("--max-spec-tokens applies to --num-spec-tokens auto only");
  }
  if (flags->values.count("spec-method")) {
    const std::string method = flags->values["spec-method"];
    num_spec = adaptive ? 8 : 4;
    int32_t ngram_min = 1, ngram_max = 3;
    for (auto st : {GetNumber(*flags, adaptive ? "max-spec-tokens" : "num-spec-tokens", &num_spec),
                    GetNumber(*flags, "ngram-min", &ngram_min), GetNumber(*flags, "ngram-max", &ngram_max)}) {
      if (!st.ok()) return st;
    }
    if (num_spec <= 0 || num_spec > 64) {
      return absl::InvalidArgumentError(absl::StrCat(adaptive ? "--max-spec-tokens" : "--num-spec-tokens",
                                                     " must be in [1, 64], got ", num_spec));
    }
    if (method == "ngram") {
      if (ngram_min < 1 || ngram_max < ngram_min) return absl::InvalidArgumentError("--ngram-min/--ngram-max: need 1 <= min <= max");
      proposer = std::make_unique<NgramProposer>(ngram_min, ngram_max);
    } else if (method == "draft") {
      if (!flags->values.count("draft-model")) return absl::InvalidArgumentError("--spec-method draft needs --draft-model PATH");
      const std::string draft_path = flags->values["draft-model"];
      auto dw = LoadModel(draft_path);
      if (!dw.ok()) return dw.status();
      if ((*dw)->config.vocab_size != vocab) {
        return absl::InvalidArgumentError(absl::StrCat(draft_path, ": the draft's vocabulary (", (*dw)->config.vocab_size,
                                                       " tokens) is incompatible with the target's (", vocab, ")"));
      }
      if (flags->values.count("draft-tokenizer")) {
        const std::string dtp = flags->values["draft-tokenizer"];
        auto dtok = LoadTokenizer(dtp, vocab);
        if (!dtok.ok()) return dtok.status();
        for (TokenId id = 0; id < std::max(tok.vocab_size(), (*dtok)->vocab_size()); ++id) {
          if ((*dtok)->DecodeToken(-1, id) != tok.DecodeToken(-1, id)) {
            return absl::InvalidArgumentError(absl::StrCat(dtp, ": the draft's tokenizer is incompatible with the target's (token ",
                                                           id, " differs)"));
          }
        }
      }
      auto draft_backend = MakeBackend(draft_spec);
      if (!draft_backend.ok()) return draft_backend.status();
      auto dm = LlamaModel::Create(std::move(dw).value(), std::move(draft_backend).value());
      if (!dm.ok()) return dm.status();
      draft_model = std::move(dm).value();
      if (auto st = draft_model->set_kv_dtype(model.kv_dtype()); !st.ok()) return st;
      const int32_t blocks = 64 * ((draft_model->config().max_seq_len + opt.block_size - 1) / opt.block_size);
      proposer = std::make_unique<DraftModelProposer>(draft_model.get(), opt.block_size, blocks);
    } else if (method == "synthetic") {
      return absl::InvalidArgumentError(
          "--spec-method synthetic is not lossless: it is only available in benchmarks and experiments");
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--spec-method: '", method, "' is not draft or ngram"));
    }
  }

  if (flags->values.count("prompts-file")) {
    BatchOptions b;
    b.prompts_file = flags->values["prompts-file"];
    b.sampling = opt.sampling;
    b.max_tokens = opt.max_tokens;
    b.add_bos = !flags->switches.count("no-bos") && tok.add_bos_default();
    b.ignore_eos = flags->switches.count("ignore-eos") > 0;
    b.progress = !flags->switches.count("no-progress");
    SchedulerConfig& sc = b.scheduler;
    sc.block_size = opt.block_size;
    sc.max_model_len = model.config().max_seq_len;
    sc.enable_prefix_caching = !flags->switches.count("no-prefix-caching");
    sc.num_blocks = 0;
    for (auto st : {GetNumber(*flags, "max-num-seqs", &sc.max_num_seqs),
                    GetNumber(*flags, "max-num-batched-tokens", &sc.max_num_batched_tokens),
                    GetNumber(*flags, "num-blocks", &sc.num_blocks), GetNumber(*flags, "max-wait-ms", &sc.max_wait_ms)}) {
      if (!st.ok()) return st;
    }
    const int32_t table = (sc.max_model_len + sc.block_size - 1) / sc.block_size;  // blocks per full context
    const int64_t block_bytes = KvCache::BlockBytes(model.config(), sc.block_size, model.kv_dtype());
    if (model.backend().on_device()) {
      // Step scratch for the largest step, allocated now: none in the step loop, and the KV pool
      // takes the memory the weights and activations leave.
      if (auto st = model.Reserve(std::max(sc.max_num_batched_tokens, sc.max_num_seqs), sc.max_num_seqs,
                                  sc.max_num_seqs * table, sc.max_num_seqs * (num_spec + 1));
          !st.ok()) {
        return st;
      }
      if (sc.num_blocks == 0) {
        auto budget = model.backend().KvBudgetBytes(gpu_util);
        if (!budget.ok()) return budget.status();
        sc.num_blocks = static_cast<int32_t>(std::min<int64_t>(*budget / block_bytes, 1 << 30));
        std::fprintf(stderr, "[specula] KV cache: %d blocks of %d tokens (%.2f GiB, gpu_memory_utilization %.2f)\n",
                     sc.num_blocks, sc.block_size, sc.num_blocks * static_cast<double>(block_bytes) / (1 << 30),
                     gpu_util);
      }
    }
    if (sc.num_blocks == 0) {
      const int64_t want = int64_t{sc.max_num_seqs} * table;
      sc.num_blocks = static_cast<int32_t>(std::min<int64_t>(want, (int64_t{4} << 30) / block_bytes));
    }
    sc.num_spec_tokens = num_spec;
    b.proposer = proposer.get();
    b.adaptive_spec = adaptive;
    if (auto st = ValidateSchedulerConfig(sc); !st.ok()) return st;
    return RunBatchGenerate(model, tok, b, stdout);
  }
  const bool add_bos = !flags->switches.count("no-bos") && tok.add_bos_default();
  const std::vector<TokenId> prompt = tok.Encode(flags->values["prompt"], add_bos);
  if (!flags->switches.count("ignore-eos")) {
    opt.stop_ids = tok.eos_ids();
    for (TokenId e : model.config().eos_token_ids) opt.stop_ids.push_back(e);
    // llama2.c models mark the end of a story with BOS.
    if (model.config().rope_interleaved && tok.bos_id() >= 0) opt.stop_ids.push_back(tok.bos_id());
  }
  if (proposer != nullptr) return RunSpeculativeSingle(model, tok, prompt, opt, proposer.get(), num_spec, adaptive);
  TokenId prev = prompt.empty() ? -1 : prompt.back();
  auto result = Generate(model, prompt, opt, [&](TokenId t) {
    const std::string piece = tok.DecodeToken(prev, t);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    prev = t;
  });
  if (!result.ok()) return result.status();
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const int32_t n = static_cast<int32_t>(result->tokens.size());
  std::fprintf(stderr,
               "[specula] prompt tokens: %d, generated tokens: %d\n"
               "[specula] prefill: %.1f tokens/s (%.1f ms), decode: %.1f tokens/s (%.1f ms)\n",
               result->prompt_tokens, n, result->prompt_tokens / std::max(result->prefill_seconds, 1e-9),
               result->prefill_seconds * 1e3, std::max(n - 1, 0) / std::max(result->decode_seconds, 1e-9),
               result->decode_seconds * 1e3);
  return absl::OkStatus();
}

absl::Status RunMakeModel(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv, {"shape", "config", "out", "vocab", "dtype", "seed"}, {"help"});
  if (!flags.ok()) return flags.status();
  if (flags->switches.count("help")) {
    std::cout << absl::StrFormat(kMakeModelUsage, absl::StrJoin(NamedShapes(), ", "));
    return absl::OkStatus();
  }
  if (flags->values.count("shape") == flags->values.count("config")) {
    return absl::InvalidArgumentError("give exactly one of --shape NAME or --config config.json");
  }
  if (!flags->values.count("out")) return absl::InvalidArgumentError("--out is required");
  absl::StatusOr<ModelConfig> config;
  if (flags->values.count("shape")) {
    config = NamedShape(flags->values["shape"]);
  } else {
    auto text = ReadTextFile(flags->values["config"]);
    if (!text.ok()) return text.status();
    config = ParseHfConfig(*text, flags->values["config"]);
  }
  if (!config.ok()) return config.status();
  int64_t seed = 0;
  for (auto st : {GetNumber(*flags, "vocab", &config->vocab_size), GetNumber(*flags, "seed", &seed)}) {
    if (!st.ok()) return st;
  }
  DType dtype = DType::kF32;
  if (flags->values.count("dtype")) {
    const std::string d = flags->values["dtype"];
    if (d == "f32") dtype = DType::kF32;
    else if (d == "f16") dtype = DType::kF16;
    else if (d == "bf16") dtype = DType::kBF16;
    else return absl::InvalidArgumentError(absl::StrCat("--dtype: '", d, "' is not f32, f16 or bf16"));
  }
  const std::string out = flags->values["out"];
  std::fprintf(stderr, "[specula] writing %.1fM parameters (%s) to %s\n",
               config->NumParams() / 1e6, flags->values.count("dtype") ? flags->values["dtype"].c_str() : "f32",
               out.c_str());
  if (auto st = WriteRandomModel(*config, out, dtype, static_cast<uint64_t>(seed)); !st.ok()) return st;
  std::fprintf(stderr, "[specula] done\n");
  return absl::OkStatus();
}

}  // namespace
}  // namespace specula

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help" ||
      std::string(argv[1]) == "-h") {
    std::cout << specula::kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  absl::Status st;
  if (cmd == "generate") {
    st = specula::RunGenerate(argc - 2, argv + 2);
  } else if (cmd == "make-model") {
    st = specula::RunMakeModel(argc - 2, argv + 2);
  } else {
    std::cerr << "specula: unknown command '" << cmd << "'\n\n" << specula::kUsage;
    return 1;
  }
  if (!st.ok()) {
    std::cerr << "specula " << cmd << ": error: " << st.message() << "\n";
    return 1;
  }
  return 0;
}

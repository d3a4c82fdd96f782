#include "engine/engine_setup.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"
#include "draft/draft_model_proposer.h"
#include "draft/ngram_proposer.h"
#include "draft/self_draft.h"
#include "kernels/make_backend.h"
#include "dist/communicator.h"
#include "model/kv_cache.h"
#include "model/tensor_parallel.h"

namespace specula {

const std::set<std::string> kEngineFlags = {
    "model", "tokenizer", "max-num-seqs", "max-num-batched-tokens", "num-blocks", "max-wait-ms", "max-tokens",
    "spec-method", "num-spec-tokens", "max-spec-tokens", "draft-model", "draft-tokenizer", "ngram-min",
    "ngram-max", "temperature", "top-k", "top-p", "min-p", "repetition-penalty", "seed", "block-size",
    "device", "dtype", "gpu-memory-utilization", "quantization", "draft-quantization", "kv-cache-dtype",
    "draft-layers", "draft-quant-type", "tensor-parallel-size", "collective-timeout-s"};
const std::set<std::string> kEngineSwitches = {"ignore-eos", "no-bos", "no-prefix-caching", "int8-activations"};

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
  --int8-activations    GGUF quantized weights multiply activations rounded to 8 bits per group of
                        32, as llama.cpp does (faster prefill; logits off by ~1%, enough to change
                        greedy text). Default: two 8-bit terms, within ~1e-4 of float32 (cpu)
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
  --spec-method M       draft (a smaller model), ngram (prompt lookup), or a draft made of the
                        target itself: layer-skip (its first --draft-layers layers, final norm and
                        classifier) or self-quant (its weights requantized to --draft-quant-type)
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
  --draft-layers N      layers of the layer-skip draft (default: a quarter of the target's)
  --draft-quant-type T  q4_0 (default), q4_1 or q8_0: the self-quant draft's weight type
)";

namespace {

// The CPU's KV cache dtype when --kv-cache-dtype is not given (README, "KV cache dtype").
constexpr DType kDefaultCpuKvDtype = DType::kBF16;

bool Exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

std::string DefaultTokenizer(const std::string& model, int32_t vocab) {
  if (Exists(model + "/tokenizer.json")) return model + "/tokenizer.json";
  if (model.size() > 5 && model.compare(model.size() - 5, 5, ".gguf") == 0) return model;  // its own vocabulary
  const size_t slash = model.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : model.substr(0, slash);
  for (const std::string& name : {std::string("tokenizer.bin"), absl::StrCat("tok", vocab, ".bin")}) {
    if (Exists(dir + "/" + name)) return dir + "/" + name;
  }
  return "";
}

}  // namespace

absl::StatusOr<std::shared_ptr<Communicator>> TensorParallelGroup(int32_t size, double timeout_s) {
  static std::shared_ptr<Communicator> group;
  if (group == nullptr) {
    const int32_t launched = LaunchedWorldSize();
    if (launched != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tensor-parallel-size ", size, " needs ", size, " processes, but ", launched,
          " were launched: run `mpirun -np ", size, " specula ...` (README, \"Tensor parallelism\")"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c, MakeMpiCommunicator(timeout_s));
    group = std::move(c);
  }
  if (group->size() != size) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size ", size, ": this process's group has ",
                                                   group->size(), " ranks"));
  }
  return group;
}

absl::StatusOr<std::unique_ptr<LoadedEngine>> LoadEngine(const Flags& flags) {
  Flags f = flags;  // operator[] below reads values that were checked to exist
  if (!f.values.count("model")) return absl::InvalidArgumentError("--model is required");
  auto e = std::make_unique<LoadedEngine>();
  RequestDefaults& opt = e->opt;
  int64_t seed = 0;
  for (auto st : {GetNumber(f, "max-tokens", &opt.max_tokens),
                  GetNumber(f, "temperature", &opt.sampling.temperature),
                  GetNumber(f, "top-k", &opt.sampling.top_k),
                  GetNumber(f, "top-p", &opt.sampling.top_p),
                  GetNumber(f, "min-p", &opt.sampling.min_p),
                  GetNumber(f, "repetition-penalty", &opt.sampling.repetition_penalty),
                  GetNumber(f, "seed", &seed), GetNumber(f, "block-size", &opt.block_size)}) {
    if (!st.ok()) return st;
  }
  opt.sampling.seed = static_cast<uint64_t>(seed);
  if (opt.block_size <= 0) return absl::InvalidArgumentError("--block-size must be positive");
  if (opt.max_tokens <= 0) return absl::InvalidArgumentError(absl::StrCat("--max-tokens must be positive, got ", opt.max_tokens));
  if (auto st = ValidateSamplingParams(opt.sampling); !st.ok()) return st;

  const std::string model_path = f.values["model"];
  int32_t tp_size = 1;
  double collective_timeout_s = 60;
  for (auto st : {GetNumber(f, "tensor-parallel-size", &tp_size), GetNumber(f, "collective-timeout-s", &collective_timeout_s)}) {
    if (!st.ok()) return st;
  }
  if (tp_size < 1) return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size must be at least 1, got ", tp_size));
  if (!(collective_timeout_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--collective-timeout-s must be positive, got ", collective_timeout_s));
  }
  auto weights = LoadModel(model_path);  // mapped: nothing is read but the header yet
  if (!weights.ok()) return weights.status();
  std::shared_ptr<Communicator> group;
  if (tp_size > 1) {
    // The cut is checked before the group forms or a weight is read.
    const ModelConfig& mc = (*weights)->config;
    const LayerWeights& l0 = (*weights)->layers.at(0);
    auto plan = PlanShard(mc, tp_size, 0, l0.wo.type, l0.w_down.type);
    if (!plan.ok()) return plan.status();
    auto g = TensorParallelGroup(tp_size, collective_timeout_s);
    if (!g.ok()) return g.status();
    group = *g;
    plan = PlanShard(mc, tp_size, group->rank(), l0.wo.type, l0.w_down.type);
    if (!plan.ok()) return plan.status();
    if (auto st = ShardWeights(**weights, *plan); !st.ok()) return st;
  }
  const int32_t vocab = (*weights)->config.vocab_size;
  std::string tok_path = f.values.count("tokenizer") ? f.values["tokenizer"]
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
  if (f.values.count("device")) backend_spec.device = f.values["device"];
  if (f.values.count("dtype")) backend_spec.dtype = f.values["dtype"];
  backend_spec.int8_activations = f.switches.count("int8-activations") > 0;
  BackendSpec draft_spec = backend_spec;
  draft_spec.int8_activations = true;  // a draft's rounding costs acceptance at most, never output
  if (f.values.count("quantization")) backend_spec.quantization = f.values["quantization"];
  if (f.values.count("draft-quantization")) draft_spec.quantization = f.values["draft-quantization"];
  // Checked before any model loads, so that a bad --draft-quantization fails fast.
  for (auto st : {CheckQuantization("--quantization", backend_spec.quantization, backend_spec.device),
                  CheckQuantization("--draft-quantization", draft_spec.quantization, draft_spec.device)}) {
    if (!st.ok()) return st;
  }
  double gpu_util = 0.9;
  if (auto st = GetNumber(f, "gpu-memory-utilization", &gpu_util); !st.ok()) return st;
  if (!(gpu_util > 0.0 && gpu_util <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-memory-utilization must be in (0, 1], got ", gpu_util));
  }
  if (group != nullptr) backend_spec.device_index = group->rank();  // one GPU per rank
  auto target_backend = MakeBackend(backend_spec);
  if (!target_backend.ok()) return target_backend.status();
  if (group != nullptr && (*target_backend)->on_device()) {
    // GPU tensors go over NCCL; the MPI group carries its unique id and the step plans.
    auto nccl = MakeNcclCommunicator(group.get(), backend_spec.device_index, (*target_backend)->native_stream());
    if (!nccl.ok()) return nccl.status();
    group = std::shared_ptr<Communicator>(std::move(nccl).value());
  }
  auto model_or = LlamaModel::Create(std::move(weights).value(), std::move(target_backend).value(), group);
  if (!model_or.ok()) return model_or.status();
  LlamaModel& model = **model_or;
  // The KV cache dtype of the target and the draft: bf16 on the CPU unless asked otherwise (see
  // --help), the compute dtype on a GPU.
  std::optional<DType> kv_dtype;
  if (f.values.count("kv-cache-dtype")) {
    const std::string d = f.values["kv-cache-dtype"];
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
  if (group != nullptr && group->rank() != 0) {
    // Ranks other than 0 compute their share of rank 0's forwards until it stops them.
    if (auto st = model.RunFollower(); !st.ok()) return st;
    e->follower = true;
    return e;
  }

  // Speculative decoding.
  std::unique_ptr<LlamaModel> draft_model;
  std::unique_ptr<Proposer> proposer;
  int32_t num_spec = 0;
  const bool adaptive = f.values.count("num-spec-tokens") && f.values["num-spec-tokens"] == "auto";
  for (const char* flag : {"draft-layers", "draft-quant-type"}) {
    const std::string method = f.values.count("spec-method") ? f.values.at("spec-method") : "";
    if (f.values.count(flag) && method != (std::string(flag) == "draft-layers" ? "layer-skip" : "self-quant")) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " applies to --spec-method ",
                                                     std::string(flag) == "draft-layers" ? "layer-skip" : "self-quant"));
    }
  }
  if (f.values.count("max-spec-tokens") && !adaptive) {
    return absl::InvalidArgumentError("--max-spec-tokens applies to --num-spec-tokens auto only");
  }
  if (f.values.count("spec-method")) {
    const std::string method = f.values["spec-method"];
    num_spec = adaptive ? 8 : 4;
    int32_t ngram_min = 1, ngram_max = 3;
    for (auto st : {GetNumber(f, adaptive ? "max-spec-tokens" : "num-spec-tokens", &num_spec),
                    GetNumber(f, "ngram-min", &ngram_min), GetNumber(f, "ngram-max", &ngram_max)}) {
      if (!st.ok()) return st;
    }
    if (num_spec <= 0 || num_spec > 64) {
      return absl::InvalidArgumentError(absl::StrCat(adaptive ? "--max-spec-tokens" : "--num-spec-tokens",
                                                     " must be in [1, 64], got ", num_spec));
    }
    if (method == "ngram") {
      if (ngram_min < 1 || ngram_max < ngram_min) return absl::InvalidArgumentError("--ngram-min/--ngram-max: need 1 <= min <= max");
      proposer = std::make_unique<NgramProposer>(ngram_min, ngram_max);
    } else if (method == "draft" || method == "layer-skip" || method == "self-quant") {
      absl::StatusOr<std::unique_ptr<ModelWeights>> dw;
      std::string draft_path = model_path;
      if (method == "draft") {
        if (!f.values.count("draft-model")) return absl::InvalidArgumentError("--spec-method draft needs --draft-model PATH");
        draft_path = f.values["draft-model"];
        dw = LoadModel(draft_path);
      } else if (method == "layer-skip") {
        int32_t layers = std::max(1, model.config().num_layers / 4);
        if (auto st = GetNumber(f, "draft-layers", &layers); !st.ok()) return st;
        dw = LayerSkipDraftWeights(model_path, layers);
      } else {
        auto type = ParseQuantType(f.values.count("draft-quant-type") ? f.values["draft-quant-type"] : "q4_0");
        if (!type.ok()) return type.status();
        dw = SelfQuantDraftWeights(model_path, *type);
      }
      if (!dw.ok()) return dw.status();
      if ((*dw)->config.vocab_size != vocab) {
        return absl::InvalidArgumentError(absl::StrCat(draft_path, ": the draft's vocabulary (", (*dw)->config.vocab_size,
                                                       " tokens) is incompatible with the target's (", vocab, ")"));
      }
      if (f.values.count("draft-tokenizer")) {
        const std::string dtp = f.values["draft-tokenizer"];
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
      return absl::InvalidArgumentError(
          absl::StrCat("--spec-method: '", method, "' is not draft, ngram, layer-skip or self-quant"));
    }
  }


  e->model_path = model_path;
  e->model = std::move(model_or).value();
  e->tokenizer = std::move(tokenizer).value();
  e->draft_model = std::move(draft_model);
  e->proposer = std::move(proposer);
  e->num_spec = num_spec;
  e->adaptive = adaptive;
  if (f.values.count("spec-method")) e->spec_method = f.values["spec-method"];
  e->add_bos = !f.switches.count("no-bos") && e->tokenizer->add_bos_default();
  e->ignore_eos = f.switches.count("ignore-eos") > 0;
  e->gpu_util = gpu_util;
  return e;
}

absl::StatusOr<SchedulerConfig> BatchSchedulerConfig(const Flags& f, LoadedEngine& e) {
  LlamaModel& model = *e.model;
  const RequestDefaults& opt = e.opt;
  const int32_t num_spec = e.num_spec;
  const double gpu_util = e.gpu_util;
  SchedulerConfig sc;
  sc.block_size = opt.block_size;
  sc.max_model_len = model.config().max_seq_len;
  sc.enable_prefix_caching = !f.switches.count("no-prefix-caching");
  sc.num_blocks = 0;
  for (auto st : {GetNumber(f, "max-num-seqs", &sc.max_num_seqs),
                  GetNumber(f, "max-num-batched-tokens", &sc.max_num_batched_tokens),
                  GetNumber(f, "num-blocks", &sc.num_blocks), GetNumber(f, "max-wait-ms", &sc.max_wait_ms)}) {
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
  if (auto st = ValidateSchedulerConfig(sc); !st.ok()) return st;
  return sc;
}

}  // namespace specula

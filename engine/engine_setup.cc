#include "engine/engine_setup.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "draft/factory.h"
#include "kernels/cpu/amx.h"
#include "kernels/make_backend.h"
#include "model/kv_cache.h"
#include "model/tensor_parallel.h"
#include "model/weights_hash.h"
#include "spec/cost_cache.h"
#include "xxhash.h"

namespace specula {

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
  const int32_t launched = LaunchedWorldSize();
  if (launched != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel-size ", size, " needs ", size, " processes, but ", launched,
        " were launched: run `mpirun -np ", size, " specula ...` (README, \"Tensor parallelism\")"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> c, MakeMpiCommunicator(timeout_s));
  if (c->size() != size) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size ", size, ": this process's group has ",
                                                   c->size(), " ranks"));
  }
  return std::shared_ptr<Communicator>(std::move(c));
}

namespace {

// This rank's shard of the weights (the cut checked before the group forms or a weight is read).
absl::Status Shard(const TargetOptions& t, ModelWeights& weights, std::shared_ptr<Communicator>* group) {
  const LayerWeights& l0 = weights.layers.at(0);
  RETURN_IF_ERROR(PlanShard(weights.config, t.tensor_parallel_size, 0, l0.wo.type, l0.w_down.type).status());
  if (*group == nullptr) {
    ASSIGN_OR_RETURN(*group, TensorParallelGroup(t.tensor_parallel_size, t.collective_timeout_s));
  }
  if ((*group)->size() != t.tensor_parallel_size) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size ", t.tensor_parallel_size,
                                                   ": the group has ", (*group)->size(), " ranks"));
  }
  ASSIGN_OR_RETURN(TpShard plan, PlanShard(weights.config, t.tensor_parallel_size, (*group)->rank(), l0.wo.type,
                                           l0.w_down.type));
  return ShardWeights(weights, plan);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TargetTokenizer(const TargetOptions& t, int32_t vocab) {
  const std::string path = !t.tokenizer.empty() ? t.tokenizer : DefaultTokenizer(t.model, vocab);
  if (path.empty()) return absl::NotFoundError(absl::StrCat("no tokenizer found beside ", t.model, "; pass --tokenizer PATH"));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path, vocab));
  if (tok->vocab_size() > vocab) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tokenizer has ", tok->vocab_size(),
                                                   " tokens but the model's vocab_size is ", vocab));
  }
  return tok;
}

// The target's loader: weights (this rank's shard), tokenizer, backend, KV dtype. On a rank other
// than 0 it then runs the rank's share of every forward until rank 0 stops (e->follower).
absl::Status LoadTarget(const TargetOptions& t, std::shared_ptr<Communicator> group, LoadedEngine* e) {
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModel(t.model));  // mapped: only the header read yet
  if (t.tensor_parallel_size > 1) RETURN_IF_ERROR(Shard(t, *weights, &group));
  const int32_t vocab = weights->config.vocab_size;
  ASSIGN_OR_RETURN(e->tokenizer, TargetTokenizer(t, vocab));
  BackendSpec spec{t.device, t.dtype, group != nullptr ? group->rank() : 0, t.quantization, t.int8_activations};
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeBackend(spec));
  if (group != nullptr && backend->on_device()) {
    // GPU tensors go over NCCL; the MPI group carries its unique id and the step plans.
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> nccl,
                     MakeNcclCommunicator(group.get(), spec.device_index, backend->native_stream()));
    group = std::shared_ptr<Communicator>(std::move(nccl));
  }
  ASSIGN_OR_RETURN(e->model, LlamaModel::Create(std::move(weights), std::move(backend), group));
  // bf16 on the CPU unless asked otherwise (--help), the compute dtype on a GPU.
  if (!t.kv_cache_dtype.empty()) {
    RETURN_IF_ERROR(e->model->set_kv_dtype(*ParseDType(t.kv_cache_dtype)));
  } else if (!e->model->backend().on_device()) {
    RETURN_IF_ERROR(e->model->set_kv_dtype(kDefaultCpuKvDtype));
  }
  if (group != nullptr && group->rank() != 0) {
    RETURN_IF_ERROR(e->model->RunFollower());
    e->follower = true;
  }
  return absl::OkStatus();
}

// The store of auto's measured costs for one model of the engine (--cost-cache), or null when off.
// `role`: the target, or the draft and what makes it.
absl::StatusOr<std::shared_ptr<CostStore>> CostCacheFor(const EngineOptions& o, const std::string& model,
                                                       const CostIdentity& role) {
  const SpeculationOptions& s = o.speculation;
  if (!s.adaptive || s.cost_cache.empty() || s.cost_cache == "none") return nullptr;
  ASSIGN_OR_RETURN(CostIdentity id, ModelFileIdentity(model));
  id.merge(MachineIdentity());
  id.merge(CostIdentity(role));
  const TargetOptions& t = o.target;
  id.merge(CostIdentity{{"device", t.device}, {"dtype", t.dtype}, {"quantization", t.quantization},
                        {"int8_activations", t.int8_activations ? "1" : "0"},
                        {"tensor_parallel_size", std::to_string(t.tensor_parallel_size)}});
  return OpenCostCache(s.cost_cache, id);
}

// The proposer of --spec-method from its factory; a draft model runs on the target's device, with
// its KV dtype, and one activation term (its rounding costs acceptance at most, never output).
absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(const EngineOptions& o, const LoadedEngine& e) {
  const SpeculationOptions& s = o.speculation;
  if (s.method == "ngram") return MakeNgramProposer(s.ngram_min, s.ngram_max);
  if (s.method == "suffix") return MakeSuffixProposer(s.suffix_max_depth, s.suffix_cache_tokens, s.suffix_min_prob);
  const int32_t vocab = e.model->config().vocab_size;
  DraftRuntime rt{{o.target.device, o.target.dtype, 0, s.draft_quantization, true}, e.model->kv_dtype(),
                  o.defaults.block_size, vocab, nullptr};
  const int32_t skip_layers = s.draft_layers > 0 ? s.draft_layers : std::max(1, e.model->config().num_layers / 4);
  const bool self = s.method == "layer-skip" || s.method == "self-quant";
  CostIdentity role{{"role", "draft"}, {"method", s.method}, {"draft_quantization", s.draft_quantization}};
  if (s.method == "layer-skip") role["draft_layers"] = std::to_string(skip_layers);
  if (s.method == "self-quant") role["draft_quant_type"] = s.draft_quant_type;
  ASSIGN_OR_RETURN(rt.cost_store, CostCacheFor(o, self ? o.target.model : s.draft_model, role));
  if (s.method == "layer-skip") return MakeLayerSkipProposer(o.target.model, skip_layers, rt);
  if (s.method == "self-quant") return MakeSelfQuantProposer(o.target.model, s.draft_quant_type, rt);
  if (!s.draft_tokenizer.empty()) {  // checked against the target's before the draft loads
    ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> dtok, LoadTokenizer(s.draft_tokenizer, vocab));
    for (TokenId id = 0; id < std::max(e.tokenizer->vocab_size(), dtok->vocab_size()); ++id) {
      if (dtok->DecodeToken(-1, id) != e.tokenizer->DecodeToken(-1, id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            s.draft_tokenizer, ": the draft's tokenizer is incompatible with the target's (token ", id, " differs)"));
      }
    }
  }
  return MakeDraftModelProposer(s.draft_model, rt);
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoadedEngine>> LoadEngine(const EngineOptions& options,
                                                         std::shared_ptr<Communicator> group) {
  RETURN_IF_ERROR(ValidateEngineOptions(options));
  auto e = std::make_unique<LoadedEngine>();
  e->options = options;
  RETURN_IF_ERROR(LoadTarget(options.target, std::move(group), e.get()));
  if (e->follower) return e;
  ASSIGN_OR_RETURN(e->model->measured_cost().store, CostCacheFor(options, options.target.model, {{"role", "target"}}));
  if (options.speculation.method != "none") {
    ASSIGN_OR_RETURN(e->proposer, MakeProposer(options, *e));
  }
  e->add_bos = options.add_bos && e->tokenizer->add_bos_default();
  return e;
}

RequestContext RequestContextOf(const LoadedEngine& e) {
  RequestContext c = ModelRequestContext(e.tokenizer.get(), e.model->config().vocab_size, e.model->config().max_seq_len);
  c.add_bos = e.add_bos;
  c.default_max_tokens = e.defaults().max_tokens;
  return c;
}

absl::StatusOr<SchedulerConfig> BatchSchedulerConfig(LoadedEngine& e) {
  LlamaModel& model = *e.model;
  const BatchingOptions& b = e.options.batching;
  const int32_t num_spec = e.num_spec();
  const double gpu_util = e.options.target.gpu_memory_utilization;
  SchedulerConfig sc;
  sc.block_size = e.options.defaults.block_size;
  sc.max_model_len = model.config().max_seq_len;
  sc.enable_prefix_caching = b.enable_prefix_caching;
  sc.max_num_seqs = b.max_num_seqs;
  sc.max_num_batched_tokens = b.max_num_batched_tokens;
  sc.num_blocks = b.num_blocks;
  sc.max_wait_ms = b.max_wait_ms;
  const int32_t table = (sc.max_model_len + sc.block_size - 1) / sc.block_size;  // blocks per full context
  const int64_t block_bytes = KvCache::BlockBytes(model.config(), sc.block_size, model.kv_dtype());
  if (model.backend().on_device()) {
    // Step scratch for the largest step, allocated now: none in the step loop, and the KV pool
    // takes the memory the weights and activations leave.
    if (auto st = model.Reserve(std::max(sc.max_num_batched_tokens, sc.max_num_seqs), sc.max_num_seqs,
                                sc.max_num_seqs * table,
                                sc.max_num_seqs * (num_spec + e.options.speculation.grammar_drafts + 1));
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

SchedulerConfig SinglePromptSchedulerConfig(const LoadedEngine& e, size_t prompt_tokens, int32_t max_tokens) {
  SchedulerConfig sc;
  sc.max_num_seqs = 1;
  sc.block_size = e.defaults().block_size;
  sc.max_model_len = e.model->config().max_seq_len;
  sc.max_num_batched_tokens = std::max(2048, e.num_spec() + 1);
  sc.num_spec_tokens = e.num_spec();
  const int64_t tokens = std::min<int64_t>(sc.max_model_len, prompt_tokens + max_tokens + e.num_spec() + 1);
  sc.num_blocks = static_cast<int32_t>((tokens + sc.block_size - 1) / sc.block_size) + 1;
  return sc;
}

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(LoadedEngine& e, const EngineVariant& variant) {
  SchedulerConfig sc;
  if (variant.scheduler.has_value()) {
    sc = *variant.scheduler;
  } else {
    ASSIGN_OR_RETURN(sc, BatchSchedulerConfig(e));
  }
  auto engine = std::make_unique<Engine>(e.model.get(), e.tokenizer.get(), sc, variant.spec.value_or(e.spec_config()),
                                         variant.clock);
  RETURN_IF_ERROR(engine->Validate());
  return engine;
}

namespace {

// The CPU kernels this build and machine run: the build's instruction set (-march=native) and AMX's
// int8 tiles where the CPU and Linux allow them.
std::string CpuKernels() {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
  std::string v = "avx512-vnni";
#elif defined(__AVX512F__)
  std::string v = "avx512";
#elif defined(__AVX2__)
  std::string v = "avx2";
#else
  std::string v = "generic";
#endif
  return cpu::amx::Usable() ? v + "+amx" : v;
}

}  // namespace

absl::StatusOr<std::string> KvReplicaSalt(const LoadedEngine& e, int32_t block_size,
                                          const std::string& weights_hash_cache, std::string* description) {
  const TargetOptions& t = e.options.target;
  ASSIGN_OR_RETURN(std::string weights, WeightsHash(t.model, weights_hash_cache));
  const Backend& backend = e.model->backend();
  const std::string d = absl::StrCat(
      "weights=", weights, " backend=", backend.name(), " kernels=", CpuKernels(), " dtype=", DTypeName(backend.dtype()),
      " kv=", DTypeName(e.model->kv_dtype()), " block=", block_size, " quantization=", t.quantization,
      " int8_activations=", t.int8_activations ? 1 : 0, " tp=", t.tensor_parallel_size);
  if (description != nullptr) *description = d;
  return absl::StrFormat("%016x", XXH3_64bits(d.data(), d.size()));
}

}  // namespace specula

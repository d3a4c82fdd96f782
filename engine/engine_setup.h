// Building the engine that EngineOptions (engine/options.h) describe: the target's loader (model,
// tokenizer, backend, tensor-parallel shard, KV dtype), the proposer from its factory
// (draft/factory.h), the continuous-batching scheduler with its KV pool, and the Engine over them
// (MakeEngine, which every command and the experiments build their engines with).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "dist/communicator.h"
#include "draft/proposer.h"
#include "engine/engine.h"
#include "engine/options.h"
#include "model/llama_model.h"
#include "request/boundary.h"
#include "tokenizer/tokenizer.h"
#include "scheduler/scheduler.h"

namespace specula {

struct LoadedEngine {
  EngineOptions options;  // as given
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Proposer> proposer;  // null: no speculation (a draft model is the proposer's)
  bool add_bos = true;                 // the tokenizer's BOS, unless --no-bos
  // Tensor parallelism, on a rank other than 0: LoadEngine has already run this rank's share of
  // every forward (LlamaModel::RunFollower) until rank 0 stopped; nothing else is loaded, and the
  // command has nothing left to do.
  bool follower = false;

  const RequestDefaults& defaults() const { return options.defaults; }
  bool ignore_eos() const { return options.ignore_eos; }
  // k, or the largest k under auto; 0 without speculation.
  int32_t num_spec() const { return proposer == nullptr ? 0 : options.speculation.num_spec_tokens; }
  bool adaptive() const { return proposer != nullptr && options.speculation.adaptive; }  // --num-spec-tokens auto
  // The engine's speculation: the proposer and whether k is chosen each step.
  SpecConfig spec_config() const {
    SpecConfig spec;
    spec.proposer = proposer.get();
    spec.adaptive = adaptive();
    spec.grammar_drafts = options.speculation.grammar_drafts;
    return spec;
  }
};

// Loads the target, its tokenizer and the proposer; every option is checked (an error names its
// flag and value) before anything large loads. With options.target.tensor_parallel_size > 1,
// `group` is the tensor-parallel group (TensorParallelGroup) and each rank loads its shard; see
// LoadedEngine::follower.
absl::StatusOr<std::unique_ptr<LoadedEngine>> LoadEngine(const EngineOptions& options,
                                                         std::shared_ptr<Communicator> group = nullptr);

// The tensor-parallel group of `size` ranks (MPI_COMM_WORLD), made once by the command and passed
// to every LoadEngine; an error naming the mpirun command when the launcher started another number
// of processes.
absl::StatusOr<std::shared_ptr<Communicator>> TensorParallelGroup(int32_t size, double timeout_s);

// NormalizeRequest's context for requests to this engine: the target's vocabulary and context,
// its tokenizer, BOS unless --no-bos, and --max-tokens as the configured default.
RequestContext RequestContextOf(const LoadedEngine& e);

// The scheduler of options.batching: the KV pool sized for max-num-seqs full contexts (at most 4
// GiB) on the CPU, from --gpu-memory-utilization on a GPU, where the step scratch is reserved now.
absl::StatusOr<SchedulerConfig> BatchSchedulerConfig(LoadedEngine& e);

// The scheduler of one prompt: one sequence, a KV pool for the prompt, its max_tokens and the
// drafts' lookahead, no more.
SchedulerConfig SinglePromptSchedulerConfig(const LoadedEngine& e, size_t prompt_tokens, int32_t max_tokens);

// What a command changes in the engine that its options describe.
struct EngineVariant {
  // The scheduler and its KV pool; unset: BatchSchedulerConfig(e).
  std::optional<SchedulerConfig> scheduler;
  // The speculation; unset: the loaded proposer, auto or not (LoadedEngine::spec_config). SpecConfig{}: none.
  std::optional<SpecConfig> spec;
  Clock* clock = nullptr;  // null: the steady clock
};

// The engine over what LoadEngine loaded (`e` must outlive it), as e.options and `variant` describe
// it, validated (Engine::Validate).
absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(LoadedEngine& e, const EngineVariant& variant = {});

// What keys an engine's KV blocks in a shared store (Engine::AttachKvStore): 16 hex digits of a
// hash of everything that changes a block's bits: the weights (model/weights_hash.h, cached in
// `weights_hash_cache`), compute and KV dtypes, quantization and activation rounding, block size,
// the backend and its kernels (AVX-512, AVX2, AMX give different bits). `description` (may be null)
// gets the readable form. Errors: the model cannot be read.
absl::StatusOr<std::string> KvReplicaSalt(const LoadedEngine& e, int32_t block_size,
                                          const std::string& weights_hash_cache, std::string* description);

}  // namespace specula

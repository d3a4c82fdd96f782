// The engine and speculation flags that `generate`, `serve` and the experiment harness share:
// loading the target, its tokenizer and the draft, and sizing the continuous-batching scheduler and
// its KV pool. Here, below tools/, so that experiments/ builds engines the way the CLI does.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "draft/proposer.h"
#include "engine/engine.h"
#include "model/sampler.h"
#include "model/llama_model.h"
#include "tokenizer/tokenizer.h"
#include "scheduler/scheduler.h"
#include "core/flags.h"
#include "dist/communicator.h"

namespace specula {

// Flags read by LoadEngine and BatchSchedulerConfig (their --help text is in kEngineFlagsHelp).
extern const std::set<std::string> kEngineFlags;
extern const std::set<std::string> kEngineSwitches;  // --ignore-eos, --no-bos, --no-prefix-caching
extern const char kEngineFlagsHelp[];

// What a request gets where it does not say: --max-tokens, the sampling flags, --block-size.
struct RequestDefaults {
  int32_t max_tokens = 256;
  SamplingParams sampling;
  int32_t block_size = 16;
};

struct LoadedEngine {
  std::string model_path;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LlamaModel> draft_model;  // --spec-method draft
  std::unique_ptr<Proposer> proposer;       // null: no speculation
  std::string spec_method = "none";         // none, draft or ngram
  int32_t num_spec = 0;                     // k, or the largest k under auto
  bool adaptive = false;                    // --num-spec-tokens auto
  RequestDefaults opt;
  bool add_bos = true;                      // the tokenizer's BOS, unless --no-bos
  bool ignore_eos = false;
  double gpu_util = 0.9;
  // Tensor parallelism, on a rank other than 0: LoadEngine has already run this rank's share of
  // every forward (LlamaModel::RunFollower) until rank 0 stopped; nothing else is loaded, and the
  // command has nothing left to do.
  bool follower = false;
};

// Loads the target, its tokenizer and the speculation method the flags name; every flag is checked
// (an error names it and its value) before anything large loads where that is possible. With
// --tensor-parallel-size N under mpirun, each rank loads its shard; see LoadedEngine::follower.
absl::StatusOr<std::unique_ptr<LoadedEngine>> LoadEngine(const Flags& flags);

// The process's tensor-parallel group of `size` ranks (MPI_COMM_WORLD), made once (MPI is
// initialised once per process) and shared by every engine the process loads; an error naming the
// mpirun command when the launcher started another number of processes. LoadEngine calls it for
// --tensor-parallel-size; `experiment run` too, to send each point's flags to the other ranks.
absl::StatusOr<std::shared_ptr<Communicator>> TensorParallelGroup(int32_t size, double timeout_s);

// The continuous-batching scheduler of the flags (--max-num-seqs, --num-blocks, ...): the KV pool
// sized for max-num-seqs full contexts (at most 4 GiB) on the CPU, from --gpu-memory-utilization on
// a GPU, where the step scratch is reserved now.
absl::StatusOr<SchedulerConfig> BatchSchedulerConfig(const Flags& flags, LoadedEngine& e);

}  // namespace specula
